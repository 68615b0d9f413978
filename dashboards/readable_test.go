package dashboards_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/dashboards"
)

// rawPanel is a generated panel as Grafana reads it, every key kept.
type rawPanel map[string]any

func rawPanels(t *testing.T, uid string) []rawPanel {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(jsonDir, uid+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Panels []rawPanel `json:"panels"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Panels
}

func (p rawPanel) str(keys ...string) string {
	var v any = map[string]any(p)
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = m[k]
	}
	switch x := v.(type) {
	case string:
		return x
	case float64:
		return strings.TrimRight(strings.TrimRight(json.Number(jsonNum(x)).String(), "0"), ".")
	case bool:
		if x {
			return "true"
		}
		return "false"
	}
	return ""
}

func jsonNum(f float64) string { b, _ := json.Marshal(f); return string(b) }

// TestBarChartsLabelTheirBars fails on a bar chart whose bars would be
// labelled "…" or not at all: every bar chart names its label field, and
// none cuts labels to nothing (xTickLabelMaxLength 0).
func TestBarChartsLabelTheirBars(t *testing.T) {
	labelFields := []string{"Run", "Rank name", "Part"}
	n := 0
	for _, d := range dashboards.All() {
		for _, p := range rawPanels(t, d.UID) {
			if p["type"] != "barchart" {
				continue
			}
			n++
			opts, _ := p["options"].(map[string]any)
			if v, ok := opts["xTickLabelMaxLength"]; ok && v == float64(0) {
				t.Errorf("%s: %q: xTickLabelMaxLength 0 cuts every label to …", d.UID, p["title"])
			}
			if x := p.str("options", "xField"); !slices.Contains(labelFields, x) {
				t.Errorf("%s: %q: xField %q, want one of %v", d.UID, p["title"], x, labelFields)
			}
		}
	}
	if n == 0 {
		t.Fatal("no bar charts found")
	}
}

// TestRunScopedPanelsShowTheRun fails when a time panel of a run-scoped
// dashboard follows the dashboard's relative range ("Last 7 days") instead
// of the run's window: each carries the $run_span / $run_shift override,
// and the variables behind it are hidden window parts of $run.
func TestRunScopedPanelsShowTheRun(t *testing.T) {
	docs := loadDashboards(t)
	for _, uid := range []string{dashboards.UIDTrainingRun, dashboards.UIDRanks} {
		timed := 0
		for _, p := range rawPanels(t, uid) {
			switch p["type"] {
			case "timeseries", "heatmap", "state-timeline", "status-history":
			default:
				continue
			}
			timed++
			if p["timeFrom"] != dashboards.RunSpan || p["timeShift"] != dashboards.RunShift {
				t.Errorf("%s: %q: timeFrom %v timeShift %v, want %s and %s", uid, p["title"], p["timeFrom"], p["timeShift"], dashboards.RunSpan, dashboards.RunShift)
			}
		}
		if timed == 0 {
			t.Errorf("%s: no time panels", uid)
		}
		parts := map[string]string{}
		for _, v := range docs[uid].Templating.List {
			var q api.VariableQuery
			if err := json.Unmarshal(v.Query, &q); err != nil || q.Resource != api.VariableWindow {
				continue
			}
			if q.Run != "$run" {
				t.Errorf("%s: %s: window of %q, want $run", uid, v.Name, q.Run)
			}
			parts[v.Name] = q.Part
		}
		for name, part := range map[string]string{"run_span": "span", "run_shift": "shift", "run_from": "from", "run_to": "to"} {
			if parts[name] != part {
				t.Errorf("%s: variable %s: part %q, want %q", uid, name, parts[name], part)
			}
		}
		b, _ := os.ReadFile(filepath.Join(jsonDir, uid+".json"))
		if !strings.Contains(string(b), "from=${run_from}&to=${run_to}") {
			t.Errorf("%s: no link carrying the run's window", uid)
		}
	}
}

// TestHeatmapsReadable fails on a per-layer heatmap Grafana would draw
// without labels or with clipped rows: x on the run's time window (the
// Heatmap panel's x is always time), rows as given, first layer on top,
// room for full layer names, a fine colour scale, absolute milliseconds
// in the tooltip, forward and backward side by side.
func TestHeatmapsReadable(t *testing.T) {
	var pos []map[string]any
	for _, p := range rawPanels(t, dashboards.UIDTrainingRun) {
		if p["type"] != "heatmap" {
			continue
		}
		title := p["title"]
		checks := map[string][2]string{
			"calculate":    {p.str("options", "calculate"), "false"},
			"yAxis.rev":    {p.str("options", "yAxis", "reverse"), "true"},
			"color.mode":   {p.str("options", "color", "mode"), "scheme"},
			"color.scale":  {p.str("options", "color", "scale"), "linear"},
			"cellValues":   {p.str("options", "cellValues", "unit"), "ms"},
			"tooltip.mode": {p.str("options", "tooltip", "mode"), "single"},
		}
		for k, c := range checks {
			if c[0] != c[1] {
				t.Errorf("%q: %s = %q, want %q", title, k, c[0], c[1])
			}
		}
		if w, _ := p["options"].(map[string]any)["yAxis"].(map[string]any)["axisWidth"].(float64); w < 180 {
			t.Errorf("%q: y axis %v px clips layer names", title, w)
		}
		if s, _ := p["options"].(map[string]any)["color"].(map[string]any)["steps"].(float64); s < 64 {
			t.Errorf("%q: %v colour steps", title, s)
		}
		tg, err := decodeTarget(mustJSON(t, p["targets"].([]any)[0]))
		if err != nil || tg.XAxis != "time" || tg.QueryType != api.QueryHeatmap {
			t.Errorf("%q: target %+v %v, want a heatmap query on a time x", title, tg.PluginQuery, err)
		}
		pos = append(pos, p["gridPos"].(map[string]any))
	}
	if len(pos) != 2 {
		t.Fatalf("%d heatmaps, want forward and backward", len(pos))
	}
	if pos[0]["y"] != pos[1]["y"] || pos[0]["w"].(float64)+pos[1]["w"].(float64) > 24 {
		t.Errorf("heatmaps not side by side: %v %v", pos[0], pos[1])
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCompareTablesFit fails when a compare table would need horizontal
// scrolling at 1600 px or hides a figure's Δ away from it: at most eleven
// columns per full-width table (fewer for narrower ones), and each Δ
// column right after its figure.
func TestCompareTablesFit(t *testing.T) {
	tables := 0
	for _, p := range rawPanels(t, dashboards.UIDCompare) {
		if p["type"] != "table" {
			continue
		}
		tables++
		var order map[string]any
		for _, tr := range p["transformations"].([]any) {
			m := tr.(map[string]any)
			if m["id"] == "organize" {
				order = m["options"].(map[string]any)["indexByName"].(map[string]any)
			}
		}
		if order == nil {
			t.Errorf("%q: no column order", p["title"])
			continue
		}
		w := p["gridPos"].(map[string]any)["w"].(float64)
		// About 140 px a column at 1600 px for 24 grid units.
		if maxCols := int(w * 1600 / 24 / 140); len(order) > maxCols {
			t.Errorf("%q: %d columns in %v grid units, at most %d fit", p["title"], len(order), w, maxCols)
		}
		for name, i := range order {
			if fig, ok := strings.CutPrefix(name, "Δ "); ok {
				if j, ok := order[fig]; !ok || j.(float64)+1 != i.(float64) {
					t.Errorf("%q: %q at %v not right after %q at %v", p["title"], name, i, fig, j)
				}
			}
		}
	}
	if tables < 4 {
		t.Errorf("%d compare tables, want the focused tables of each section", tables)
	}
}
