package plugin

import (
	"strings"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// regressionQuery is what changed against the run's baseline runs, from
// GET /runs/{id}/regression (docs/regression.md): the server's sentence
// first, then the figures, the places and what differs, each a frame of
// its own that a table panel offers in its frame picker.
var regressionQuery = get[api.Regression]{
	path: runPathOf("regression"),
	params: func(r request) params {
		p := params{}
		if b := regressionBaseline(r.Baseline); b != "" {
			p.set("baseline", b)
		}
		return p
	},
	frames: func(_ request, rg api.Regression) data.Frames { return regressionFrames(rg) },
}

// regressionBaseline is the pinned baseline runs of a regression query,
// comma-separated; a picker's All (or the compare table's first run) pins
// none, and the server picks the comparable runs.
func regressionBaseline(b string) string {
	if b == api.AllValue || b == api.BaselineFirst {
		return ""
	}
	return strings.Join(splitList([]string{b}), ",")
}

// basisWords says how the baseline was chosen.
var basisWords = map[string]string{
	"fingerprint": "the newest comparable runs",
	"tag":         "the comparable runs tagged as baseline",
	"run":         "the runs pinned",
}

// regressionFrames are the sentence (one row, always), the figures, the
// places (phases, layers, ranks and the ranks' hosts) and what differs.
func regressionFrames(rg api.Regression) data.Frames {
	one := []api.Regression{rg}
	sentence := data.NewFrame(api.RegressionSentenceFrame,
		strCol(one, "sentence", "What changed", func(r api.Regression) string { return r.Sentence }),
		strCol(one, "cause", "Likely cause", func(r api.Regression) string { return r.Cause }),
		strCol(one, "basis", "Baseline", func(r api.Regression) string {
			if w, ok := basisWords[r.Basis]; ok && len(r.Baseline) > 0 {
				return w
			}
			return r.Basis
		}),
		strCol(one, "baseline", "Baseline runs", func(r api.Regression) string { return strings.Join(r.Baseline, ", ") }),
		strCol(one, "note", "Note", func(r api.Regression) string { return r.Note }),
	)
	figs := rg.Figures
	figures := data.NewFrame(api.RegressionFiguresFrame,
		strCol(figs, "figure", "Figure", func(f api.Figure) string { return inWords(figureNames, f.Name) }),
		numCol(figs, "value", "", "This run", func(f api.Figure) *float64 { return fp(f.Value) }),
		numCol(figs, "baseline_mean", "", "Baseline mean", func(f api.Figure) *float64 { return fp(f.BaselineMean) }),
		numCol(figs, "spread", "", "Spread (σ)", func(f api.Figure) *float64 { return fp(f.Spread) }),
		strCol(figs, "unit", "Unit", func(f api.Figure) string { return f.Unit }),
		intCol(figs, "n", "Baseline runs", func(f api.Figure) *int64 { return i64(int64(f.N)) }),
		numCol(figs, "delta_pct", "percent", "Δ", func(f api.Figure) *float64 { return fp(f.DeltaPct) }),
		numCol(figs, "threshold_pct", "percent", "Threshold", func(f api.Figure) *float64 { return fp(f.ThresholdPct) }),
		boolCol(figs, "worse", "Worse beyond the spread", func(f api.Figure) bool { return f.Worse }),
	)
	type place struct {
		kind string
		d    *api.PlaceDelta
		name string
	}
	var places []place
	for _, g := range []struct {
		kind string
		ds   []api.PlaceDelta
	}{{"phase", rg.Phases}, {"layer", rg.Layers}, {"rank", rg.Ranks}} {
		for i := range g.ds {
			places = append(places, place{g.kind, &g.ds[i], g.ds[i].Name})
		}
	}
	for _, h := range rg.Hosts {
		places = append(places, place{kind: "host", name: h})
	}
	ms := func(get func(d *api.PlaceDelta) api.Float) func(place) *float64 {
		return func(p place) *float64 {
			if p.d == nil {
				return nil
			}
			return fv(get(p.d))
		}
	}
	where := data.NewFrame(api.RegressionPlacesFrame,
		strCol(places, "kind", "Where", func(p place) string { return p.kind }),
		strCol(places, "name", "Name", func(p place) string { return p.name }),
		numCol(places, "value_ms", "ms", "This run", ms(func(d *api.PlaceDelta) api.Float { return d.Value })),
		numCol(places, "baseline_ms", "ms", "Baseline", ms(func(d *api.PlaceDelta) api.Float { return d.Baseline })),
		numCol(places, "delta_ms", "ms", "Δ ms", ms(func(d *api.PlaceDelta) api.Float { return d.DeltaMS })),
		numCol(places, "delta_pct", "percent", "Δ", ms(func(d *api.PlaceDelta) api.Float { return d.DeltaPct })),
	)
	ds := rg.Differs
	differs := data.NewFrame(api.RegressionDiffersFrame,
		strCol(ds, "what", "What", func(d api.Difference) string { return inWords(differenceNames, d.What) }),
		strCol(ds, "key", "Key", func(d api.Difference) string { return d.Key }),
		strCol(ds, "value", "This run", func(d api.Difference) string { return d.Value }),
		strCol(ds, "baseline", "Baseline", func(d api.Difference) string { return d.Baseline }),
	)
	return data.Frames{sentence, figures, where, differs}
}

// figureNames are the regression's figures in words.
var figureNames = map[string]string{
	"step_time_ms":   "Step time",
	"throughput_sps": "Throughput",
	"mfu":            "MFU",
	"peak_mem_gb":    "Peak GPU memory",
}

// inWords is k in the words of names, or k itself where names has none.
func inWords(names map[string]string, k string) string {
	if w, ok := names[k]; ok {
		return w
	}
	return k
}

// differenceNames are the kinds of difference in words.
var differenceNames = map[string]string{
	"git_commit": "Git commit",
	"git_diff":   "Git diff",
	"config":     "Config key",
	"version":    "Library version",
	"hosts":      "Hosts",
	"gpu_clock":  "GPU clock",
	"throttle":   "Throttling",
}
