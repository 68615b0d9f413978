package dashboards_test

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/dashboards"
	"github.com/deepseed/deepseed/internal/fleettest"
)

// noValueCharPx is about the width of a character of Grafana's no-data
// text, and statCharPx of a stat panel's value font at a card's size.
const (
	noValueCharPx = 7.5
	statCharPx    = 11
)

// TestNoValueFits walks every panel of every dashboard: a panel that can
// be empty says why in words that fit it at 1,600 px (Grafana cuts a
// stat's text to one line and a chart's to two), never a cut sentence.
func TestNoValueFits(t *testing.T) {
	for _, d := range dashboards.All() {
		for _, p := range rawPanels(t, d.UID) {
			nv := p.str("fieldConfig", "defaults", "noValue")
			if p.str("type") == "row" || nv == "" {
				continue
			}
			w, _ := p.get("gridPos", "w").(float64)
			px := w*1600/24 - 24
			charPx, lines := noValueCharPx, 2.0
			if p.str("type") == "stat" {
				charPx, lines = statCharPx, 1
			}
			if fit := int(px / charPx * lines); utf8.RuneCountInString(nv) > fit {
				t.Errorf("%s: %q: noValue of %d characters, %d fit: %q", d.UID, p["title"], utf8.RuneCountInString(nv), fit, nv)
			}
		}
	}
}

// barLabelCharPx is about the width of a character of a bar chart's
// axis labels (12 px).
const barLabelCharPx = 6.1

// TestEmptyCellsUncoloured: a table cell without a value reads "–" in
// the text's colour. A Δ column colours its text by thresholds, and an
// uncoloured mapping left its "–" painted as a gain or a loss.
func TestEmptyCellsUncoloured(t *testing.T) {
	n := 0
	for _, d := range dashboards.All() {
		for _, p := range rawPanels(t, d.UID) {
			if p.str("type") != "table" {
				continue
			}
			maps, _ := p.get("fieldConfig", "defaults", "mappings").([]any)
			special := 0
			for _, m := range maps {
				mm, _ := m.(map[string]any)
				if mm["type"] != "special" {
					continue
				}
				special++
				r := rawPanel(mm).get("options", "result")
				res, _ := r.(map[string]any)
				if res["text"] != "–" || res["color"] != "text" {
					t.Errorf("%s: %q: special-value mapping %v; want \"–\" in the text colour", d.UID, p["title"], res)
				}
			}
			if special == 0 {
				t.Errorf("%s: %q: no mapping for empty cells", d.UID, p["title"])
			}
			n++
		}
	}
	if n == 0 {
		t.Fatal("no tables")
	}
}

// TestCompareBarsNameRunsInFull: no compare bar chart cuts a run's name
// (Grafana cuts from the left: "raining Progress (simulated)").
func TestCompareBarsNameRunsInFull(t *testing.T) {
	longest := ""
	for _, r := range fleettest.DemoRuns(time.Now()) {
		if titleTextPx(r.Name) > titleTextPx(longest) {
			longest = r.Name
		}
	}
	n := 0
	for _, p := range rawPanels(t, dashboards.UIDCompare) {
		if p["type"] != "barchart" {
			continue
		}
		n++
		if v := p.get("options", "xTickLabelMaxLength"); v != nil {
			t.Errorf("%q: xTickLabelMaxLength %v cuts run names", p["title"], v)
		}
		// Grafana's uPlot axis gives the names at most 40 % of the chart
		// (calculateAxisSize), in 12-px text: about 6.1 px a character,
		// as "raining Progress (simulated)" took 170 px.
		w, _ := p.get("gridPos", "w").(float64)
		room := (w*gridWidthPx/24 - 16) * 0.4
		if px := float64(utf8.RuneCountInString(longest)) * barLabelCharPx; px > room {
			t.Errorf("%q: %.0f px for run names, %q needs %.0f", p["title"], room, longest, px)
		}
		// Grafana measures the names narrower than it draws them: a blank
		// axis label adds the slack ("pert-large …" without it).
		label := false
		for _, o := range anyList(p.get("fieldConfig", "overrides")) {
			m, _ := o.(map[string]any)
			if mt, _ := m["matcher"].(map[string]any); mt["options"] != "Run" {
				continue
			}
			for _, pr := range anyList(m["properties"]) {
				pm, _ := pr.(map[string]any)
				label = label || pm["id"] == "custom.axisLabel" && pm["value"] != ""
			}
		}
		if !label {
			t.Errorf("%q: the run names' axis has no label to make room", p["title"])
		}
	}
	if n == 0 {
		t.Fatal("no compare bar charts")
	}
}

// TestRankBarsSorted: past a few dozen ranks a bar per rank in rank order
// is a solid block; sorted by the figure, the bars read as the ranks'
// distribution, the flagged (red) ranks at one end.
func TestRankBarsSorted(t *testing.T) {
	n := 0
	for _, p := range rawPanels(t, dashboards.UIDRanks) {
		if p["type"] != "barchart" {
			continue
		}
		n++
		sorted := false
		for _, tr := range anyList(p["transformations"]) {
			m, _ := tr.(map[string]any)
			if m["id"] == "sortBy" {
				sorted = true
			}
		}
		if !sorted {
			t.Errorf("%q: bars in rank order", p["title"])
		}
	}
	if n < 5 {
		t.Errorf("%d per-rank bar charts, want 5", n)
	}
}

// TestBarLabelsThinOut: a bar chart whose labels thin out as its bars
// narrow (xTickLabelSpacing) gives its label field a blank no-value text:
// Grafana writes each skipped label as that field's no-value text, and
// the panel's sentence under each of a thousand ranks' bars was a grey
// smear.
func TestBarLabelsThinOut(t *testing.T) {
	n := 0
	for _, d := range dashboards.All() {
		for _, p := range rawPanels(t, d.UID) {
			spacing, _ := p.get("options", "xTickLabelSpacing").(float64)
			x, _ := p.get("options", "xField").(string)
			if p["type"] != "barchart" || spacing == 0 || x == "" {
				continue
			}
			n++
			blank := false
			for _, o := range anyList(p.get("fieldConfig", "overrides")) {
				m, _ := o.(map[string]any)
				if opt, _ := m["matcher"].(map[string]any)["options"].(string); opt != x {
					continue
				}
				for _, pr := range anyList(m["properties"]) {
					pm := pr.(map[string]any)
					if v, ok := pm["value"].(string); pm["id"] == "noValue" && ok && strings.TrimSpace(v) == "" {
						blank = true
					}
				}
			}
			if !blank {
				t.Errorf("%s %q: skipped labels of %q read the panel's no-value text %q", d.UID, p["title"], x,
					p.str("fieldConfig", "defaults", "noValue"))
			}
		}
	}
	if n == 0 {
		t.Error("no bar chart thins its labels")
	}
}

// TestCompareBaselineDefault: Compare opens with the first selected run
// as the baseline, an option of its own named so (not "All"), rather
// than whatever run the list offers first.
func TestCompareBaselineDefault(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(jsonDir, "deepseed-compare.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Templating struct {
			List []struct {
				Name       string            `json:"name"`
				Query      api.VariableQuery `json:"query"`
				IncludeAll bool              `json:"includeAll"`
				Current    struct {
					Text  string `json:"text"`
					Value string `json:"value"`
				} `json:"current"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	for _, v := range doc.Templating.List {
		if v.Name != "baseline" {
			continue
		}
		if v.IncludeAll || !v.Query.Baseline || v.Current.Value != api.BaselineFirst || v.Current.Text != api.BaselineOptionText {
			t.Errorf("baseline: includeAll %v, query %+v, current %+v; want no All, the baseline list, current %q (%s)",
				v.IncludeAll, v.Query, v.Current, api.BaselineOptionText, api.BaselineFirst)
		}
		return
	}
	t.Fatal("no baseline variable")
}

// TestBandLegendsInWords: the legends of a distribution over ranks or
// GPUs are words ("GPU utilisation, p95 of ranks"), not a metric's column
// name ("gpu_util_pct p95 of ranks"); the band's overrides match them.
func TestBandLegendsInWords(t *testing.T) {
	n := 0
	for _, d := range dashboards.All() {
		for _, p := range rawPanels(t, d.UID) {
			for _, o := range anyList(p.get("fieldConfig", "overrides")) {
				m, _ := o.(map[string]any)
				name, _ := m["matcher"].(map[string]any)["options"].(string)
				if !strings.HasSuffix(name, " of ranks") && !strings.HasSuffix(name, " of GPUs") {
					continue
				}
				n++
				if strings.Contains(name, "_") || !strings.Contains(name, ", ") {
					t.Errorf("%s: %q: legend %q is not in words", d.UID, p["title"], name)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no band overrides found")
	}
}

// schemeEnds are the colours at 0 and 1 of Grafana's heatmap schemes
// (d3-scale-chromatic's interpolators), as sRGB.
var schemeEnds = map[string][2][3]float64{
	"Turbo":    {{35, 23, 27}, {144, 12, 0}},
	"Spectral": {{158, 1, 66}, {94, 79, 162}},
	"RdYlBu":   {{165, 0, 38}, {49, 54, 149}},
	"Viridis":  {{68, 1, 84}, {253, 231, 37}},
}

// darkBackground is the panel background of Grafana's dark theme.
var darkBackground = [3]float64{17, 18, 23}

// TestHeatmapEndsVisible: both ends of every heatmap's colour scale stand
// out from the dark theme's background (contrast at least 2:1), so a cell
// at the bottom of the range, or clipped to it, does not read as missing.
func TestHeatmapEndsVisible(t *testing.T) {
	n := 0
	for _, d := range dashboards.All() {
		for _, p := range rawPanels(t, d.UID) {
			if p["type"] != "heatmap" {
				continue
			}
			n++
			scheme := p.str("options", "color", "scheme")
			ends, ok := schemeEnds[scheme]
			if p.str("options", "color", "mode") != "scheme" || !ok {
				t.Errorf("%s: %q: colour %v: want a known scheme", d.UID, p["title"], p.get("options", "color"))
				continue
			}
			for i, c := range ends {
				if r := contrast(c, darkBackground); r < 2 {
					t.Errorf("%s: %q: %s's end %d %v has contrast %.2f on the dark background", d.UID, p["title"], scheme, i, c, r)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no heatmaps")
	}
}

// contrast is the WCAG contrast ratio of two sRGB colours.
func contrast(a, b [3]float64) float64 {
	la, lb := luminance(a), luminance(b)
	return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)
}

func luminance(c [3]float64) float64 {
	w := [3]float64{0.2126, 0.7152, 0.0722}
	l := 0.0
	for i, v := range c {
		v /= 255
		if v <= 0.04045 {
			v /= 12.92
		} else {
			v = math.Pow((v+0.055)/1.055, 2.4)
		}
		l += w[i] * v
	}
	return l
}

// TestETACardSaysUnknown: the time-to-finish card is empty also for a
// running run (silent past the stall limit, or of unknown total steps),
// so its empty text must not say "not running".
func TestETACardSaysUnknown(t *testing.T) {
	for _, p := range rawPanels(t, dashboards.UIDTrainingRun) {
		if p["title"] != "Est. time to finish" {
			continue
		}
		if nv := p.str("fieldConfig", "defaults", "noValue"); nv != "unknown" {
			t.Errorf("noValue %q, want \"unknown\"", nv)
		}
		return
	}
	t.Fatal("no Est. time to finish card")
}

// Grafana's grid and table geometry, in pixels: a grid row and the
// margin between rows, a panel's title bar, and a small table row (the
// header and the pagination footer are one row each).
const (
	gridRowPx   = 30
	gridGapPx   = 8
	titlePx     = 32
	tableRowPx  = 36
	barAxisPx   = 16
	fullCompare = 21
)

func panelPx(h float64) float64 { return h*gridRowPx + (h-1)*gridGapPx }

// TestCompareFitsTwentyOneRuns: 21 runs compared page in whole pages of
// at least seven rows in every table (nine grid rows showed six of 12),
// and each gets a bar at least 20 px tall, room for its name, in every
// bar chart.
func TestCompareFitsTwentyOneRuns(t *testing.T) {
	for _, p := range rawPanels(t, dashboards.UIDCompare) {
		h, _ := p.get("gridPos", "h").(float64)
		switch p["type"] {
		case "table":
			rows := int((panelPx(h) - titlePx - 2*tableRowPx) / tableRowPx)
			if rows < 7 || fullCompare%rows != 0 && rows < fullCompare {
				t.Errorf("%q: %d rows a page; 21 runs want pages of 7", p["title"], rows)
			}
		case "barchart":
			if bar := (panelPx(h) - titlePx - barAxisPx) / fullCompare; bar < 20 {
				t.Errorf("%q: %.1f px a bar at 21 runs, want 20", p["title"], bar)
			}
		}
	}
}

// TestCompareNoSweepAll: the sweep picker offers no "All", which in a
// project without sweeps made a section "Sweep All" repeating every table.
func TestCompareNoSweepAll(t *testing.T) {
	for _, v := range loadDashboards(t)[dashboards.UIDCompare].Templating.List {
		if v.Name == "sweep" {
			if v.IncludeAll {
				t.Error("sweep offers All")
			}
			return
		}
	}
	t.Fatal("no sweep variable")
}

// gridDefaultMinWidthPx is a table column's width in Grafana when it sets
// none: its default minimum.
const gridDefaultMinWidthPx = 150

// gridWidthPx is the width of a dashboard's 24 grid columns in a 1,600-px
// window: Grafana 12.3 docks its menu there (about 260 px) and pads the
// dashboard, as the screenshots under testdata/screenshots show.
const gridWidthPx = 1280

// checkTableFits fails when the columns a table shows of frames are wider
// than the panel in a 1,600-px window, sized as Grafana 12.3's table sizes
// them (computeColWidths): a column with a width has it, the others share
// what is left, each at least its minimum width (the table's, else
// Grafana's default). A minimum above the share pushes the rightmost
// columns off-screen.
func checkTableFits(t *testing.T, p rawPanel, frames data.Frames) {
	t.Helper()
	type sizing struct {
		match                 func(name string, f *data.Field) bool
		width, minPx          float64
		hide, hideSet         bool
		filterable, filterSet bool
	}
	var rules []sizing
	least := float64(gridDefaultMinWidthPx)
	if v, ok := p.get("fieldConfig", "defaults", "custom", "minWidth").(float64); ok && v > 0 {
		least = v
	}
	for _, o := range anyList(p.get("fieldConfig", "overrides")) {
		m, _ := o.(map[string]any)
		matcher, _ := m["matcher"].(map[string]any)
		opt, _ := matcher["options"].(string)
		r := sizing{}
		switch matcher["id"] {
		case "byName":
			r.match = func(n string, _ *data.Field) bool { return n == opt }
		case "byRegexp":
			re := grafanaRegexp(t, opt)
			r.match = func(n string, _ *data.Field) bool { return re.MatchString(n) }
		case "byType":
			r.match = func(_ string, f *data.Field) bool { return fieldKind(f) == opt }
		default:
			continue
		}
		for _, pr := range anyList(m["properties"]) {
			pm := pr.(map[string]any)
			switch pm["id"] {
			case "custom.width":
				r.width, _ = pm["value"].(float64)
			case "custom.minWidth":
				r.minPx, _ = pm["value"].(float64)
			case "custom.hidden":
				r.hide, _ = pm["value"].(bool)
				r.hideSet = true
			case "custom.filterable":
				r.filterable, _ = pm["value"].(bool)
				r.filterSet = true
			}
		}
		rules = append(rules, r)
	}
	hidden := map[string]bool{}
	var keep *regexp.Regexp // filterFieldsByName's include, if any
	for _, tr := range anyList(p["transformations"]) {
		m, _ := tr.(map[string]any)
		opts, _ := m["options"].(map[string]any)
		switch m["id"] {
		case "organize":
			ex, _ := opts["excludeByName"].(map[string]any)
			for n, v := range ex {
				if v == true {
					hidden[n] = true
				}
			}
		case "filterFieldsByName":
			inc, _ := opts["include"].(map[string]any)
			if pat, ok := inc["pattern"].(string); ok {
				keep = grafanaRegexp(t, pat)
			} else if names := anyList(inc["names"]); len(names) > 0 {
				alts := make([]string, 0, len(names))
				for _, n := range names {
					alts = append(alts, regexp.QuoteMeta(fmt.Sprint(n)))
				}
				keep = regexp.MustCompile("^(" + strings.Join(alts, "|") + ")$")
			}
		}
	}
	w, _ := p.get("gridPos", "w").(float64)
	// The panel's padding, and a vertical scroll bar where rows overflow.
	room := w*gridWidthPx/24 - 24
	filterAll, _ := p.get("fieldConfig", "defaults", "custom", "filterable").(bool)
	var cols []string
	var fixed []float64 // a column's width, 0 for one sized by share
	var mins []float64
	var filters []bool
	var fields []*data.Field
	for _, f := range frames[0].Fields {
		n := f.Name
		if f.Config != nil {
			n = cmp.Or(f.Config.DisplayName, f.Config.DisplayNameFromDS, n)
		}
		if keep != nil && !keep.MatchString(n) && !keep.MatchString(f.Name) {
			continue
		}
		if hidden[n] || hidden[f.Name] {
			continue
		}
		width, minPx, hide, filter := 0.0, least, false, filterAll
		for _, r := range rules {
			if !r.match(n, f) && !r.match(f.Name, f) {
				continue
			}
			if r.width > 0 {
				width = r.width
			}
			if r.minPx > 0 {
				minPx = r.minPx
			}
			if r.hideSet {
				hide = r.hide
			}
			if r.filterSet {
				filter = r.filterable
			}
		}
		if hide {
			continue
		}
		cols = append(cols, n)
		fields = append(fields, f)
		fixed = append(fixed, width)
		mins = append(mins, minPx)
		filters = append(filters, filter)
	}
	defined, auto := 0.0, 0
	for _, v := range fixed {
		if v > 0 {
			defined += v
		} else {
			auto++
		}
	}
	total := defined
	for i, v := range fixed {
		if v == 0 {
			fixed[i] = math.Max(mins[i], (room-defined)/float64(auto))
			total += fixed[i]
		}
	}
	if total > room+0.5 {
		t.Errorf("%q: columns %v take %.0f px, the panel has %.0f", p["title"], cols, total, room)
	}
	// A header wraps at its spaces: its longest word must fit beside the
	// cell's padding and, where the column filters, the filter's icon
	// ("Proj…" at 80 px, "G…" at 60).
	for i, n := range cols {
		need := 0.0
		for _, word := range strings.Fields(strings.ReplaceAll(n, "-", "- ")) {
			need = math.Max(need, headerTextPx(word))
		}
		need += headerPaddingPx
		if filters[i] {
			need += headerFilterPx
		}
		if need > fixed[i]+0.5 {
			t.Errorf("%q: header %q needs %.0f px, its column has %.0f", p["title"], n, need, fixed[i])
		}
		// A name (a host, a run, a sweep: text without spaces) is cut
		// at its end, where hosts and runs differ ("small-8x300-node-").
		if f := fields[i]; f.Type() == data.FieldTypeString || f.Type() == data.FieldTypeNullableString {
			for j := 0; j < f.Len(); j++ {
				v, _ := f.ConcreteAt(j)
				str, _ := v.(string)
				if str == "" || strings.ContainsRune(str, ' ') {
					continue
				}
				if px := headerTextPx(str) + headerPaddingPx; px > fixed[i]+0.5 {
					t.Errorf("%q: column %q cuts %q (%.0f px) at %.0f px", p["title"], n, str, px, fixed[i])
					break
				}
			}
		}
	}
}

// A table header's and a cell's text is about as wide as a panel title's
// (calibrated on what Grafana 12.3 cut: "Final val_accura…" at 100 px,
// "sw-7a9bf64c1a0…" at 125); its cell pads it and a filterable column
// adds the filter's icon.
const (
	headerPaddingPx = 22
	headerFilterPx  = 24
)

func headerTextPx(s string) float64 { return titleTextPx(s) }

// fieldKind is a field's type as Grafana's byType matcher names it.
func fieldKind(f *data.Field) string {
	switch {
	case f.Type().Numeric():
		return "number"
	case f.Type().Time():
		return "time"
	case f.Type() == data.FieldTypeBool || f.Type() == data.FieldTypeNullableBool:
		return "boolean"
	default:
		return "string"
	}
}

// titleTextPx is about how wide Grafana draws a panel title (Inter, 14 px):
// narrow letters, wide ones, capitals and the rest.
func titleTextPx(s string) float64 {
	px := 0.0
	for _, r := range s {
		switch {
		case strings.ContainsRune("iljIftr!|.,:;'()[] ", r):
			px += 4
		case strings.ContainsRune("mwMW", r):
			px += 10
		case r >= 'A' && r <= 'Z':
			px += 9
		default:
			px += 7.5
		}
	}
	return px
}

// titleRoomPx is the room a title has in a panel w grid columns wide on
// a 1,600-px screen (the docked menu takes about 300 px; the header's
// padding, information and menu icons about 106), calibrated on the two
// titles Grafana 12.3 cut there: "Peak GPU memo…" and "Peak allocated (…"
// in panels four columns wide.
func titleRoomPx(w float64) float64 { return w*(1600-300)/24 - 106 }

// TestTitlesFit: no panel title is cut at 1,600 px.
func TestTitlesFit(t *testing.T) {
	for _, cut := range []string{"Peak GPU memory (NVML)", "Peak allocated (PyTorch)"} {
		if titleTextPx(cut) <= titleRoomPx(4) {
			t.Fatalf("the model fits %q, which Grafana cut", cut)
		}
	}
	for _, d := range dashboards.All() {
		for _, p := range rawPanels(t, d.UID) {
			w, _ := p.get("gridPos", "w").(float64)
			if title := p.str("title"); p["type"] != "row" && titleTextPx(title) > titleRoomPx(w) {
				t.Errorf("%s: %q is cut: %.0f px in %.0f", d.UID, title, titleTextPx(title), titleRoomPx(w))
			}
		}
	}
}

// TestStepAxisLinear: a step chart whose values are on a logarithmic
// axis keeps its step axis linear (the defaults' scale applies to the x
// field too: Step time's x axis was logarithmic).
func TestStepAxisLinear(t *testing.T) {
	n := 0
	for _, d := range dashboards.All() {
		for _, p := range rawPanels(t, d.UID) {
			if p["type"] != "trend" {
				continue
			}
			n++
			linear := false
			for _, o := range anyList(p.get("fieldConfig", "overrides")) {
				m, _ := o.(map[string]any)
				if m["matcher"].(map[string]any)["options"] != dashboards.StepField {
					continue
				}
				for _, pr := range anyList(m["properties"]) {
					pm := pr.(map[string]any)
					if sd, ok := pm["value"].(map[string]any); ok && pm["id"] == "custom.scaleDistribution" && sd["type"] == "linear" {
						linear = true
					}
				}
			}
			if !linear {
				t.Errorf("%s: %q: the step axis takes the values' scale %v", d.UID, p["title"], p.get("fieldConfig", "defaults", "custom", "scaleDistribution"))
			}
		}
	}
	if n == 0 {
		t.Fatal("no step charts")
	}
}

// TestStragglerRedIsItsOwn: a chart that draws a flagged rank red draws
// its other lines in shades of blue, not Grafana's classic palette, whose
// red gave "vm GPU 0" the straggler's colour.
func TestStragglerRedIsItsOwn(t *testing.T) {
	n := 0
	for _, d := range dashboards.All() {
		for _, p := range rawPanels(t, d.UID) {
			red := false
			for _, o := range anyList(p.get("fieldConfig", "overrides")) {
				m, _ := o.(map[string]any)
				if m["matcher"].(map[string]any)["options"] == dashboards.StragglerSeries {
					red = true
				}
			}
			if !red || p["type"] == "table" {
				continue
			}
			n++
			if mode, c := p.str("fieldConfig", "defaults", "color", "mode"), p.str("fieldConfig", "defaults", "color", "fixedColor"); mode != "shades" || c != "blue" {
				t.Errorf("%s: %q: colours %q %q beside the straggler's red", d.UID, p["title"], mode, c)
			}
		}
	}
	if n == 0 {
		t.Fatal("no chart draws a straggler")
	}
}

// TestGPUNodesLegendsFit: a host's charts list a line per GPU and metric
// (eight GPUs of two metrics: sixteen), which a legend list below a chart
// eight rows high cut at the fourth entry. Each keeps its legend as a
// table beside the chart, tall enough for sixteen rows.
func TestGPUNodesLegendsFit(t *testing.T) {
	// Grafana's grid rows are 30 px with 8 px between them; a panel's
	// header and padding take about 48 px, a legend table row 22.
	const rowPx, gridRowPx, gapPx, headerPx = 22.0, 30.0, 8.0, 48.0
	n := 0
	for _, p := range rawPanels(t, dashboards.UIDGPUNodes) {
		if p["type"] != "timeseries" {
			continue
		}
		n++
		h, _ := p.get("gridPos", "h").(float64)
		mode, place := p.str("options", "legend", "displayMode"), p.str("options", "legend", "placement")
		if mode != "table" || place != "right" {
			t.Errorf("%q: legend %s at the %s, want a table on the right", p["title"], mode, place)
		}
		if room := h*gridRowPx + (h-1)*gapPx - headerPx; room < 17*rowPx {
			t.Errorf("%q: %.0f rows high: room for %.0f legend rows, want a header and 16", p["title"], h, room/rowPx)
		}
	}
	if n < 9 {
		t.Fatalf("%d host charts, want 9", n)
	}
}

// TestSymlogAxesDrawNoNegativeTick: Grafana 12.3 draws a symmetric-log
// axis bounded at 0 down to minus its linear threshold, so a threshold of
// 1 ms put a "-1 ms" tick under the Step time chart; each such axis keeps
// its threshold at 0.1 or below and is soft-bounded at 0.
func TestSymlogAxesDrawNoNegativeTick(t *testing.T) {
	n := 0
	for _, d := range dashboards.All() {
		for _, p := range rawPanels(t, d.UID) {
			if p.str("fieldConfig", "defaults", "custom", "scaleDistribution", "type") != "symlog" {
				continue
			}
			n++
			lin, _ := p.get("fieldConfig", "defaults", "custom", "scaleDistribution", "linearThreshold").(float64)
			soft, ok := p.get("fieldConfig", "defaults", "custom", "axisSoftMin").(float64)
			if lin > 0.1 || !ok || soft != 0 {
				t.Errorf("%s %q: symlog threshold %v, soft minimum %v (set %v): a tick below 0 shows", d.UID, p["title"], lin, soft, ok)
			}
		}
	}
	if n == 0 {
		t.Error("no symmetric-log axis checked")
	}
}
