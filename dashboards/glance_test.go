package dashboards_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/deepseed/deepseed/dashboards"
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

// TestCompareBarsNameRunsInFull: no compare bar chart cuts a run's name
// (Grafana cuts from the left: "raining Progress (simulated)").
func TestCompareBarsNameRunsInFull(t *testing.T) {
	n := 0
	for _, p := range rawPanels(t, dashboards.UIDCompare) {
		if p["type"] != "barchart" {
			continue
		}
		n++
		if v := p.get("options", "xTickLabelMaxLength"); v != nil {
			t.Errorf("%q: xTickLabelMaxLength %v cuts run names", p["title"], v)
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

// TestCompareBaselineDefault: Compare opens with the first selected run
// as the baseline, not whatever run the list offers first.
func TestCompareBaselineDefault(t *testing.T) {
	docs := loadDashboards(t)
	for _, v := range docs[dashboards.UIDCompare].Templating.List {
		if v.Name != "baseline" {
			continue
		}
		if got := v.AllValue; got != "@first" || !v.IncludeAll {
			t.Errorf("baseline: includeAll %v, allValue %v; want the first selected run as All", v.IncludeAll, v.AllValue)
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
