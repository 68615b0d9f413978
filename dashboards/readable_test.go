package dashboards_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
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

// get is the raw value at keys, or nil.
func (p rawPanel) get(keys ...string) any {
	var v any = map[string]any(p)
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
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

// TestRunScopedPanelsShowTheRun fails when a chart of a run-scoped
// dashboard follows the dashboard's relative range ("Last 7 days") instead
// of the run: a time panel carries the $run_span / $run_shift override
// (the variables behind it are hidden window parts of $run); a step chart
// (Trend) or a heatmap asks only for step-axis data, which the plugin
// answers for the whole run whatever the time range.
func TestRunScopedPanelsShowTheRun(t *testing.T) {
	docs := loadDashboards(t)
	for _, uid := range []string{dashboards.UIDTrainingRun, dashboards.UIDRanks} {
		timed, stepped := 0, 0
		for _, p := range rawPanels(t, uid) {
			switch p["type"] {
			case "timeseries", "state-timeline", "status-history":
				timed++
				if p["timeFrom"] != dashboards.RunSpan || p["timeShift"] != dashboards.RunShift {
					t.Errorf("%s: %q: timeFrom %v timeShift %v, want %s and %s", uid, p["title"], p["timeFrom"], p["timeShift"], dashboards.RunSpan, dashboards.RunShift)
				}
			case "trend", "heatmap":
				stepped++
				for _, tg := range panelTargets(t, p) {
					if !onStepAxis(tg.PluginQuery) {
						t.Errorf("%s: %q: query %s %+v is not on the step axis", uid, p["title"], tg.QueryType, tg.PluginQuery)
					}
				}
			}
		}
		if timed == 0 || stepped == 0 {
			t.Errorf("%s: %d time panels, %d step panels", uid, timed, stepped)
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

// onStepAxis reports whether the plugin answers q with the step as x.
func onStepAxis(q api.PluginQuery) bool {
	switch q.QueryType {
	case api.QueryHeatmap:
		return q.XAxis != "time"
	case api.QuerySeries, api.QueryEvals:
		return q.XAxis == "step"
	}
	return false
}

func panelTargets(t *testing.T, p rawPanel) []target {
	t.Helper()
	raw, _ := p["targets"].([]any)
	out := make([]target, 0, len(raw))
	for _, r := range raw {
		tg, err := decodeTarget(mustJSON(t, r))
		if err != nil {
			t.Fatalf("%q: target: %v", p["title"], err)
		}
		out = append(out, tg)
	}
	return out
}

// TestEveryPanelReadable checks the axis and label options of every panel
// of every dashboard, one rule set per panel type; a panel of a type with
// no rules fails, so a new kind of chart gets its checks too.
func TestEveryPanelReadable(t *testing.T) {
	rules := map[string]func(p rawPanel) []string{
		"row":            func(rawPanel) []string { return nil },
		"table":          tableRules,
		"stat":           statRules,
		"timeseries":     timeSeriesRules,
		"state-timeline": stateTimelineRules,
		"trend":          trendRules,
		"heatmap":        heatmapRules,
		"barchart":       barChartRules,
		"piechart":       pieChartRules,
		"bargauge":       barGaugeRules,
	}
	for _, d := range dashboards.All() {
		for _, p := range rawPanels(t, d.UID) {
			rule, ok := rules[p.str("type")]
			if !ok {
				t.Errorf("%s: %q: no readability rules for panel type %q", d.UID, p["title"], p["type"])
				continue
			}
			if p.str("type") != "row" && p.str("title") == "" {
				t.Errorf("%s: a %s panel without a title", d.UID, p["type"])
			}
			for _, problem := range rule(p) {
				t.Errorf("%s: %q (%s): %s", d.UID, p["title"], p["type"], problem)
			}
		}
	}
}

// want is a list of (got, want, what) checks turned into problems.
func want(checks ...[3]string) []string {
	var out []string
	for _, c := range checks {
		if c[0] != c[1] {
			out = append(out, fmt.Sprintf("%s = %q, want %q", c[2], c[0], c[1]))
		}
	}
	return out
}

// legendShown: a chart of several series names them.
func legendShown(p rawPanel) []string {
	return want([3]string{p.str("options", "legend", "showLegend"), "true", "legend.showLegend"})
}

func tableRules(p rawPanel) []string {
	return want([3]string{p.str("options", "showHeader"), "true", "showHeader"})
}

// A stat shows its figure in a unit, or is text (model, GPU, status).
func statRules(p rawPanel) []string {
	var out []string
	if p.str("options", "reduceOptions", "fields") == "" {
		out = append(out, "no reduceOptions.fields: which figure it shows is left to chance")
	}
	return append(out, want([3]string{p.str("options", "textMode"), "value", "textMode"})...)
}

func timeSeriesRules(p rawPanel) []string {
	out := legendShown(p)
	if p.str("fieldConfig", "defaults", "unit") == "" {
		out = append(out, "no unit on the y axis")
	}
	return out
}

func stateTimelineRules(p rawPanel) []string { return legendShown(p) }

// A step chart draws the plugin's frames joined on Step, with Step on x
// and labelled so.
func trendRules(p rawPanel) []string {
	out := append(legendShown(p), want(
		[3]string{p.str("options", "xField"), dashboards.StepField, "options.xField"},
		[3]string{p.str("fieldConfig", "defaults", "custom", "spanNulls"), "true", "spanNulls (joined series have holes)"},
	)...)
	if p.str("fieldConfig", "defaults", "unit") == "" {
		out = append(out, "no unit on the y axis")
	}
	joined := false
	for _, tr := range anyList(p["transformations"]) {
		m, _ := tr.(map[string]any)
		if m["id"] == "joinByField" {
			o, _ := m["options"].(map[string]any)
			joined = o["byField"] == dashboards.StepField && o["mode"] == "outer"
		}
	}
	if !joined {
		out = append(out, "frames not joined on Step: the Trend panel draws one frame only")
	}
	labelled := false
	for _, o := range anyList(p.get("fieldConfig", "overrides")) {
		m, _ := o.(map[string]any)
		if mm, _ := m["matcher"].(map[string]any); mm["options"] != dashboards.StepField {
			continue
		}
		for _, pr := range anyList(m["properties"]) {
			if pm, _ := pr.(map[string]any); pm["id"] == "custom.axisLabel" && pm["value"] == dashboards.StepField {
				labelled = true
			}
		}
	}
	if !labelled {
		out = append(out, "x axis not labelled Step")
	}
	return out
}

// A per-layer heatmap reads like the seed's: x labelled by step, rows
// as sent (first layer on top) with room for full layer names, a colour
// scheme whose range the data source sets (no fixed min or max),
// milliseconds in the tooltip with the colour scale, a legend.
func heatmapRules(p rawPanel) []string {
	out := want(
		[3]string{p.str("options", "calculate"), "false", "calculate"},
		[3]string{p.str("options", "yAxis", "reverse"), "true", "yAxis.reverse (first layer on top)"},
		[3]string{p.str("options", "yAxis", "axisLabel"), "Layer", "yAxis.axisLabel"},
		[3]string{p.str("options", "color", "mode"), "scheme", "color.mode"},
		[3]string{p.str("options", "color", "scale"), "linear", "color.scale"},
		[3]string{p.str("options", "color", "min"), "", "color.min (the plugin sets the range)"},
		[3]string{p.str("options", "color", "max"), "", "color.max (the plugin sets the range)"},
		[3]string{p.str("options", "cellValues", "unit"), "ms", "cellValues.unit"},
		[3]string{p.str("options", "tooltip", "mode"), "single", "tooltip.mode"},
		[3]string{p.str("options", "tooltip", "showColorScale"), "true", "tooltip.showColorScale"},
		[3]string{p.str("options", "legend", "show"), "true", "legend.show"},
		[3]string{p.str("options", "showValue"), "never", "showValue (numbers on 2,600 cells are noise)"},
	)
	if p.str("options", "rowsFrame", "value") == "" {
		out = append(out, "rowsFrame.value: the tooltip would call the time \"Value\"")
	}
	if w, _ := p.get("options", "yAxis", "axisWidth").(float64); w < 200 {
		out = append(out, fmt.Sprintf("y axis %v px clips layer names", w))
	}
	if s, _ := p.get("options", "color", "steps").(float64); s < 64 {
		out = append(out, fmt.Sprintf("%v colour steps blur small differences", s))
	}
	return out
}

func barChartRules(p rawPanel) []string {
	var out []string
	if v, ok := p.get("options", "xTickLabelMaxLength").(float64); ok && v == 0 {
		out = append(out, "xTickLabelMaxLength 0 cuts every label to …")
	}
	if x := p.str("options", "xField"); !slices.Contains([]string{"Run", "Rank name", "Part"}, x) {
		out = append(out, fmt.Sprintf("xField %q labels no bar by its run, rank or part", x))
	}
	if p.str("fieldConfig", "defaults", "unit") == "" {
		out = append(out, "no unit on the value axis")
	}
	return out
}

func pieChartRules(p rawPanel) []string {
	out := want([3]string{p.str("options", "legend", "showLegend"), "true", "legend.showLegend"})
	if len(anyList(p.get("options", "legend", "values"))) == 0 {
		out = append(out, "legend without values")
	}
	return out
}

// A bar gauge of quotas draws each bar against its own limit: no panel-wide
// max overrides the fields' own, the thresholds are percentages of it, and
// the unfilled part shows what is left.
func barGaugeRules(p rawPanel) []string {
	out := want(
		[3]string{p.str("fieldConfig", "defaults", "thresholds", "mode"), "percentage", "thresholds.mode"},
		[3]string{p.str("options", "showUnfilled"), "true", "options.showUnfilled"},
		[3]string{p.str("options", "orientation"), "horizontal", "options.orientation"},
	)
	if p.get("fieldConfig", "defaults", "max") != nil {
		out = append(out, "a panel max hides each field's own (the quota limit)")
	}
	if p.str("fieldConfig", "defaults", "unit") == "" {
		out = append(out, "no unit")
	}
	return out
}

func anyList(v any) []any { l, _ := v.([]any); return l }

// TestHeatmapsSideBySide: forward and backward per-layer heatmaps sit in
// one row, each with its own pass, on the step axis, with step ticks at
// 1280 px: Grafana's Heatmap panel puts them at most nine columns apart
// and draws none when nine columns are narrower than 40 px. Its y axis
// is titled, its title names the x axis (the panel has no x title).
func TestHeatmapsSideBySide(t *testing.T) {
	var pos []map[string]any
	var passes []string
	for _, p := range rawPanels(t, dashboards.UIDTrainingRun) {
		if p["type"] != "heatmap" {
			continue
		}
		gp := p["gridPos"].(map[string]any)
		axis := p["options"].(map[string]any)["yAxis"].(map[string]any)
		plot := gp["w"].(float64)*1280/24 - axis["axisWidth"].(float64) - 20
		for _, tg := range panelTargets(t, p) {
			passes = append(passes, tg.Pass)
			if tg.QueryType != api.QueryHeatmap || tg.XAxis == "time" || tg.MaxSteps <= 0 {
				t.Errorf("%q: target %+v, want a heatmap on steps", p["title"], tg.PluginQuery)
			}
			// The plugin's grid has at most one column per bucket, and
			// the server at most MaxSteps+1 buckets.
			if nine := 9 * plot / float64(tg.MaxSteps+1); nine < 40 {
				t.Errorf("%q: nine of %d columns are %.0f px at 1280 px: no step ticks", p["title"], tg.MaxSteps+1, nine)
			}
		}
		if axis["axisLabel"] != "Layer" || !strings.Contains(p["title"].(string), "by step") {
			t.Errorf("%q: y axis title %v; want \"Layer\" and a title naming the step axis", p["title"], axis["axisLabel"])
		}
		pos = append(pos, gp)
	}
	if !slices.Equal(passes, []string{"forward", "backward"}) {
		t.Fatalf("heatmap passes %v, want forward then backward", passes)
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

// TestFlaggedRankHighlighted: every per-rank step chart of the Ranks
// dashboard draws the line of the rank the server flags (its series named
// with the plugin's straggler suffix) thick and red.
func TestFlaggedRankHighlighted(t *testing.T) {
	n := 0
	for _, p := range rawPanels(t, dashboards.UIDRanks) {
		perRank := false
		for _, tg := range panelTargets(t, p) {
			perRank = perRank || (tg.QueryType == api.QuerySeries && tg.Rank == "all")
		}
		if !perRank {
			continue
		}
		n++
		found := false
		for _, o := range anyList(p["fieldConfig"].(map[string]any)["overrides"]) {
			m := o.(map[string]any)["matcher"].(map[string]any)
			if m["id"] == "byRegexp" && m["options"] == dashboards.StragglerSeries {
				found = regexp.MustCompile(strings.Trim(dashboards.StragglerSeries, "/")).MatchString("Lateness rank 1" + api.StragglerSuffix)
			}
		}
		if !found {
			t.Errorf("%q: no override highlighting the flagged rank's series", p["title"])
		}
	}
	if n < 4 {
		t.Errorf("%d per-rank charts, want lateness, wait, step time and score at least", n)
	}
}

// TestGPUTableColumnsFit: the GPU nodes table gives the model name and
// the run id room of their own (Grafana shares a table's width equally,
// which cut "NVIDIA H100 80GB HBM3"), and the dashboard opens on the
// last hours, not on a week that shrinks a run to a pixel.
func TestGPUTableColumnsFit(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(jsonDir, dashboards.UIDGPUNodes+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Time struct{ From, To string } `json:"time"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Time.From != "now-6h" || doc.Time.To != "now" {
		t.Errorf("opens on %s to %s, want the last 6 hours", doc.Time.From, doc.Time.To)
	}
	width := map[string]float64{}
	for _, p := range rawPanels(t, dashboards.UIDGPUNodes) {
		if p["type"] != "table" {
			continue
		}
		for _, o := range anyList(p["fieldConfig"].(map[string]any)["overrides"]) {
			m := o.(map[string]any)
			name, _ := m["matcher"].(map[string]any)["options"].(string)
			for _, pr := range anyList(m["properties"]) {
				pp := pr.(map[string]any)
				if pp["id"] == "custom.minWidth" || pp["id"] == "custom.width" {
					width[name], _ = pp["value"].(float64)
				}
			}
		}
	}
	// About 8 px a character at Grafana's table font, plus padding.
	if width["Model"] < 21*8+16 || width["Run"] < 16*8+16 {
		t.Errorf("column widths %v: a model name or run id would be cut", width)
	}
}

// TestGPUNodesFitToRun: the GPU nodes dashboard links to itself over the
// chosen run's window (the newest run's with All), so a run opened there
// directly is one click from filling the charts.
func TestGPUNodesFitToRun(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(jsonDir, dashboards.UIDGPUNodes+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Links []struct{ Title, URL string } `json:"links"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	for _, l := range doc.Links {
		if strings.Contains(l.URL, "/d/"+dashboards.UIDGPUNodes+"?") && strings.Contains(l.URL, "from=${run_from}") {
			return
		}
	}
	t.Errorf("links %+v: none fits the GPU nodes dashboard to a run", doc.Links)
}
