package detect

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/stats"
)

// RunProfile is one run's steady state as a regression compares it (the
// query server reads it from the run's rollups, docs/regression.md). The
// figures a run did not record are nil or empty.
type RunProfile struct {
	RunID string
	// StepMS is the mean step time, ThroughputSPS the ranks' throughput
	// summed, MFU the ranks' mean, PeakMemGB the highest over ranks.
	StepMS, ThroughputSPS, MFU, PeakMemGB *float64
	// Phases holds the ranks' mean time of each phase (forward_ms, …).
	Phases map[string]float64
	// Layers holds the lowest rank's mean time of each layer and pass
	// ("blocks.3 forward").
	Layers map[string]float64
	// Ranks holds each rank's own work: its data, forward, backward and
	// optimizer times.
	Ranks map[int]RankWork
	// RankHost maps ranks to hosts.
	RankHost map[int]string
	// GitCommit and DiffHash identify the code; Config is the run's
	// config flattened to dotted keys; Versions the library versions.
	GitCommit, DiffHash string
	Config              map[string]string
	Versions            map[string]string
	Hosts               []string
	// GPU is what the run's GPU samples showed over its steady state.
	GPU GPUWindow
}

// RankWork is one rank's mean own work over the steady state (ms).
type RankWork struct {
	DataMS, ComputeMS float64
}

// GPUWindow sums up a run's GPU samples over a time window: the mean SM
// clock, the share of samples with each throttle class set, and the
// GPUs ("host/gpu N") that throttled most.
type GPUWindow struct {
	Samples    int
	SMClockMHz *float64
	// ThrottlePct is the share (%) of samples with a thermal, power or
	// hardware-slowdown reason set (ThrottleMask); Reasons names the
	// classes seen, Throttled the GPUs with any.
	ThrottlePct float64
	Reasons     []string
	Throttled   []string
	// Hosts holds each host's mean SM clock.
	Hosts map[string]float64
	// ThrottledClockMHz and FreeClockMHz are the mean SM clocks of the
	// throttled samples and of the others.
	ThrottledClockMHz, FreeClockMHz *float64
}

// The NVML clocks-event reasons that slow a GPU down, by class: software
// and hardware thermal slowdown, software power cap and hardware power
// brake, hardware slowdown.
const (
	ThrottleThermal  = 0x20 | 0x40
	ThrottlePower    = 0x04 | 0x80
	ThrottleSlowdown = 0x08
	ThrottleMask     = ThrottleThermal | ThrottlePower | ThrottleSlowdown
)

// ThrottleClasses names the classes of a clocks-event reason mask.
func ThrottleClasses(mask int64) []string {
	var out []string
	if mask&ThrottleThermal != 0 {
		out = append(out, "thermal")
	}
	if mask&ThrottlePower != 0 {
		out = append(out, "power")
	}
	if mask&ThrottleSlowdown != 0 {
		out = append(out, "hw_slowdown")
	}
	return out
}

// ThrottledPctFloor is the share of throttled samples past which a run
// counts as throttled (and, over its baseline's share, as a difference).
const ThrottledPctFloor = 5.0

// CompareRuns compares a run with its baseline runs (at least one): each
// figure against the baseline's mean and spread, the phases, layers and
// ranks where the step time moved, and what differs. It fills every field
// of out but RunID, Fingerprint, Basis and Baseline.
func CompareRuns(cfg Config, run RunProfile, base []RunProfile, out *api.Regression) {
	out.Figures = []api.Figure{}
	out.Phases, out.Layers, out.Ranks = []api.PlaceDelta{}, []api.PlaceDelta{}, []api.PlaceDelta{}
	out.Hosts, out.Differs = []string{}, []api.Difference{}
	type fig struct {
		name, unit string
		get        func(RunProfile) *float64
		higherBad  bool
	}
	figs := []fig{
		{"step_time_ms", "ms", func(p RunProfile) *float64 { return p.StepMS }, true},
		{"throughput_sps", "samples/s", func(p RunProfile) *float64 { return p.ThroughputSPS }, false},
		{"mfu", "ratio", func(p RunProfile) *float64 { return p.MFU }, false},
		{"peak_mem_gb", "GB", func(p RunProfile) *float64 { return p.PeakMemGB }, true},
	}
	var worse []api.Figure
	for _, f := range figs {
		var vals []float64
		for _, b := range base {
			if v := f.get(b); v != nil && finiteF(*v) {
				vals = append(vals, *v)
			}
		}
		fo := api.Figure{Name: f.name, Unit: f.unit, N: len(vals), Value: fpF(f.get(run))}
		if len(vals) > 0 {
			mean, sd := meanSD(vals)
			fo.BaselineMean, fo.Spread = fv(mean), fv(sd)
			if v := f.get(run); v != nil && finiteF(*v) && mean != 0 {
				d := (*v - mean) / math.Abs(mean) * 100
				th := max(cfg.RegressionZ*sd/math.Abs(mean)*100, cfg.RegressionPct)
				fo.DeltaPct, fo.ThresholdPct = fv(d), fv(th)
				fo.Beyond = math.Abs(d) > th
				fo.Worse = fo.Beyond && (d > 0) == f.higherBad
			}
		}
		if fo.Worse {
			worse = append(worse, fo)
		}
		out.Figures = append(out.Figures, fo)
	}
	out.Regressed = len(worse) > 0
	stepDelta := 0.0
	if run.StepMS != nil {
		if m := meanOf(base, func(p RunProfile) (float64, bool) {
			if p.StepMS == nil {
				return 0, false
			}
			return *p.StepMS, true
		}); !math.IsNaN(m) {
			stepDelta = *run.StepMS - m
		}
	}
	out.Phases = placeDeltas(cfg, run.Phases, base, func(p RunProfile) map[string]float64 { return p.Phases }, stepDelta)
	out.Layers = placeDeltas(cfg, run.Layers, base, func(p RunProfile) map[string]float64 { return p.Layers }, stepDelta)
	var rankCause string
	out.Ranks, out.Hosts, rankCause = slowRanks(cfg, run)
	out.Differs = differences(run, base)
	// A layer beyond its spread by at least LayerStepPct % of the step
	// is a regression of its own, even when the step time stays within
	// its threshold: a model of many layers hides one layer's slowdown.
	baseStep := 0.0
	if run.StepMS != nil {
		baseStep = *run.StepMS - stepDelta
	}
	var layers []api.PlaceDelta
	for _, l := range out.Layers {
		if float64(l.DeltaMS) >= LayerStepPct/100*baseStep {
			layers = append(layers, l)
		}
	}
	out.Layers = append([]api.PlaceDelta{}, layers...)
	out.Regressed = out.Regressed || len(layers) > 0
	if !out.Regressed {
		out.Cause = ""
		out.Sentence = quietSentence(out, len(base))
		return
	}
	out.Cause = causeOf(out, rankCause)
	out.Sentence = regressionSentence(out, worse, len(base))
}

// placeDeltas compares each named part (phase or layer) with the
// baseline's mean of it: a part is named when it grew past
// max(RegressionZ × spread, LayerPct %) and by at least a tenth of the
// step time's change (or 1 % of the part when the step did not move).
func placeDeltas(cfg Config, run map[string]float64, base []RunProfile, get func(RunProfile) map[string]float64, stepDelta float64) []api.PlaceDelta {
	out := []api.PlaceDelta{}
	for _, name := range slices.Sorted(maps.Keys(run)) {
		v := run[name]
		var vals []float64
		for _, b := range base {
			if x, ok := get(b)[name]; ok && finiteF(x) {
				vals = append(vals, x)
			}
		}
		if len(vals) == 0 || !finiteF(v) {
			continue
		}
		mean, sd := meanSD(vals)
		if mean <= 0 {
			continue
		}
		d := v - mean
		th := max(cfg.RegressionZ*sd, cfg.LayerPct/100*mean)
		if d <= th || (stepDelta > 0 && d < stepDelta/10) {
			continue
		}
		out = append(out, api.PlaceDelta{Name: name, Value: api.Float(v), Baseline: api.Float(mean), DeltaMS: api.Float(d), DeltaPct: api.Float(d / mean * 100)})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].DeltaMS > out[j].DeltaMS })
	return out
}

// slowRanks names the ranks whose own work (data + compute) is more than
// LayerPct % above the run's median rank's, and at most half the ranks
// (a slowdown every rank shares is no rank's); the cause is the part
// (data or compute) of the largest excess of the slowest.
func slowRanks(cfg Config, run RunProfile) ([]api.PlaceDelta, []string, string) {
	out, hosts := []api.PlaceDelta{}, []string{}
	if len(run.Ranks) < 2 {
		return out, hosts, ""
	}
	var busy, data, comp []float64
	for _, w := range run.Ranks {
		busy, data, comp = append(busy, w.DataMS+w.ComputeMS), append(data, w.DataMS), append(comp, w.ComputeMS)
	}
	med, medData, medComp := stats.Median(busy), stats.Median(data), stats.Median(comp)
	if !(med > 0) {
		return out, hosts, ""
	}
	cause, worst := "", 0.0
	for _, r := range slices.Sorted(maps.Keys(run.Ranks)) {
		w := run.Ranks[r]
		d := w.DataMS + w.ComputeMS - med
		if d <= cfg.LayerPct/100*med || d < OwnFloorMS {
			continue
		}
		out = append(out, api.PlaceDelta{Name: fmt.Sprintf("rank %d", r), Value: api.Float(w.DataMS + w.ComputeMS), Baseline: api.Float(med),
			DeltaMS: api.Float(d), DeltaPct: api.Float(d / med * 100)})
		if h := run.RankHost[r]; h != "" && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
		if d > worst {
			worst = d
			cause = "compute"
			if w.DataMS-medData > w.ComputeMS-medComp {
				cause = CauseData
			}
		}
	}
	if 2*len(out) > len(run.Ranks) {
		return []api.PlaceDelta{}, []string{}, ""
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].DeltaMS > out[j].DeltaMS })
	slices.Sort(hosts)
	return out, hosts, cause
}

// differences lists what differs from every baseline run: the git commit
// and diff, each config key and library version whose value no baseline
// run had, the hosts no baseline run used, a mean SM clock more than
// RegressionClockPct % below the baseline's, and throttling past
// ThrottledPctFloor % of samples above the baseline's share.
func differences(run RunProfile, base []RunProfile) []api.Difference {
	out := []api.Difference{}
	values := func(get func(RunProfile) (string, bool)) ([]string, bool) {
		var vs []string
		for _, b := range base {
			v, ok := get(b)
			if !ok {
				v = "(none)"
			}
			if !slices.Contains(vs, v) {
				vs = append(vs, v)
			}
		}
		slices.Sort(vs)
		return vs, true
	}
	differ := func(what, key, v string, get func(RunProfile) (string, bool)) {
		vs, _ := values(get)
		if !slices.Contains(vs, v) {
			out = append(out, api.Difference{What: what, Key: key, Value: v, Baseline: strings.Join(vs, ", ")})
		}
	}
	if run.GitCommit != "" {
		differ("git_commit", "", run.GitCommit, func(p RunProfile) (string, bool) { return p.GitCommit, p.GitCommit != "" })
	}
	if run.DiffHash != "" {
		differ("git_diff", "", run.DiffHash, func(p RunProfile) (string, bool) { return p.DiffHash, p.DiffHash != "" })
	}
	keys := map[string]bool{}
	for k := range run.Config {
		keys[k] = true
	}
	for _, b := range base {
		for k := range b.Config {
			keys[k] = true
		}
	}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		v, ok := run.Config[k]
		if !ok {
			v = "(none)"
		}
		differ("config", k, v, func(p RunProfile) (string, bool) { x, ok := p.Config[k]; return x, ok })
	}
	for _, k := range slices.Sorted(maps.Keys(run.Versions)) {
		differ("version", k, run.Versions[k], func(p RunProfile) (string, bool) { x, ok := p.Versions[k]; return x, ok })
	}
	var newHosts []string
	for _, h := range run.Hosts {
		used := false
		for _, b := range base {
			used = used || slices.Contains(b.Hosts, h)
		}
		if !used {
			newHosts = append(newHosts, h)
		}
	}
	if len(newHosts) > 0 {
		var bh []string
		for _, b := range base {
			for _, h := range b.Hosts {
				if !slices.Contains(bh, h) {
					bh = append(bh, h)
				}
			}
		}
		slices.Sort(bh)
		out = append(out, api.Difference{What: "hosts", Value: strings.Join(newHosts, ", "), Baseline: strings.Join(bh, ", ")})
	}
	if run.GPU.SMClockMHz != nil {
		if m := meanOf(base, func(p RunProfile) (float64, bool) {
			if p.GPU.SMClockMHz == nil {
				return 0, false
			}
			return *p.GPU.SMClockMHz, true
		}); !math.IsNaN(m) && *run.GPU.SMClockMHz < m*(1-RegressionClockPct/100) {
			out = append(out, api.Difference{What: "gpu_clock", Value: fmt.Sprintf("%.0f MHz", *run.GPU.SMClockMHz), Baseline: fmt.Sprintf("%.0f MHz", m)})
		}
	}
	bt := meanOf(base, func(p RunProfile) (float64, bool) { return p.GPU.ThrottlePct, p.GPU.Samples > 0 })
	if math.IsNaN(bt) {
		bt = 0
	}
	if run.GPU.ThrottlePct >= ThrottledPctFloor && run.GPU.ThrottlePct > bt+ThrottledPctFloor {
		out = append(out, api.Difference{What: "throttle", Key: strings.Join(run.GPU.Reasons, "+"),
			Value:    fmt.Sprintf("%.0f %% of samples (%s)", run.GPU.ThrottlePct, strings.Join(run.GPU.Throttled, ", ")),
			Baseline: fmt.Sprintf("%.0f %% of samples", bt)})
	}
	return out
}

// LayerStepPct is the smallest change of a layer, in per cent of the
// baseline's step time, that names it.
const LayerStepPct = 0.5

// RegressionClockPct is how far below the baseline's mean SM clock a
// run's must be to count as a clock difference.
const RegressionClockPct = 3.0

// causeOf names the likeliest cause of a regression: throttling or a
// lower clock when the samples show them, else the slow ranks' part (data
// or compute, "host" when they share hosts the baseline never used), else
// a layer, else a phase, else the one config key or version that differs.
func causeOf(r *api.Regression, rankCause string) string {
	has := func(what string) bool {
		return slices.ContainsFunc(r.Differs, func(d api.Difference) bool { return d.What == what })
	}
	switch {
	case has("throttle"):
		return "throttling"
	case has("gpu_clock"):
		return "gpu_clock"
	case rankCause == CauseData:
		return "data"
	case len(r.Ranks) > 0 && has("hosts"):
		return "host"
	case len(r.Ranks) > 0:
		return "rank"
	case len(r.Layers) > 0:
		return "layer"
	case len(r.Phases) > 0:
		return "phase"
	}
	return ""
}

// figureWords names the figures in a sentence.
var figureWords = map[string]string{"step_time_ms": "step time", "throughput_sps": "throughput", "mfu": "MFU", "peak_mem_gb": "peak memory"}

func regressionSentence(r *api.Regression, worse []api.Figure, n int) string {
	var parts []string
	for _, f := range worse {
		word := "higher"
		if *f.DeltaPct < 0 {
			word = "lower"
		}
		if f.Name == "step_time_ms" {
			word = "slower"
		}
		parts = append(parts, fmt.Sprintf("%s %.1f %% %s", figureWords[f.Name], math.Abs(float64(*f.DeltaPct)), word))
	}
	if len(worse) == 0 {
		l := r.Layers[0]
		s := fmt.Sprintf("Layer %s is %.1f %% slower than in %d baseline run%s (+%.3g ms a step; threshold max(%g × spread, %g %%))",
			l.Name, float64(l.DeltaPct), n, plural(n), float64(l.DeltaMS), RegressionZDefault, LayerPctDefault)
		for _, f := range r.Figures {
			if f.Name == "step_time_ms" && f.DeltaPct != nil {
				s += fmt.Sprintf("; step time %+.1f %%, within its %.2g %% threshold", float64(*f.DeltaPct), float64(*f.ThresholdPct))
			}
		}
		return s + differsText(r) + "; likely cause: layer."
	}
	f := worse[0]
	s := fmt.Sprintf("This run is slower than it should be: %s than %d baseline run%s (spread %.2g %%, threshold %.2g %%)",
		strings.Join(parts, ", "), n, plural(n), float64(*f.Spread)/math.Abs(float64(*f.BaselineMean))*100, float64(*f.ThresholdPct))
	if f.Name == "peak_mem_gb" {
		s = strings.Replace(s, "is slower than it should be", "uses more memory than it should", 1)
	}
	var where []string
	if len(r.Phases) > 0 {
		where = append(where, fmt.Sprintf("in %s (+%.3g ms)", r.Phases[0].Name, float64(r.Phases[0].DeltaMS)))
	}
	if len(r.Layers) > 0 {
		where = append(where, fmt.Sprintf("layer %s (+%.3g ms)", r.Layers[0].Name, float64(r.Layers[0].DeltaMS)))
	}
	if len(r.Ranks) > 0 {
		w := r.Ranks[0].Name
		if len(r.Hosts) > 0 {
			w += " on " + strings.Join(r.Hosts, ", ")
		}
		where = append(where, w)
	}
	if len(where) > 0 {
		s += "; where: " + strings.Join(where, ", ")
	}
	s += differsText(r)
	if r.Cause != "" {
		s += "; likely cause: " + r.Cause
	}
	return s + "."
}

func differsText(r *api.Regression) string {
	var what []string
	for _, d := range r.Differs {
		what = append(what, differenceText(d))
		if len(what) == 3 {
			break
		}
	}
	if len(what) == 0 {
		return ""
	}
	return "; what differs: " + strings.Join(what, ", ")
}

func quietSentence(r *api.Regression, n int) string {
	s := fmt.Sprintf("No regression: within the spread of %d baseline run%s", n, plural(n))
	for _, f := range r.Figures {
		if f.Name == "step_time_ms" && f.DeltaPct != nil {
			s += fmt.Sprintf(" (step time %+.1f %%, threshold %.2g %%)", float64(*f.DeltaPct), float64(*f.ThresholdPct))
		}
	}
	if len(r.Differs) > 0 {
		var what []string
		for _, d := range r.Differs {
			what = append(what, differenceText(d))
			if len(what) == 3 {
				break
			}
		}
		s += "; what differs, without effect: " + strings.Join(what, ", ")
	}
	return s + "."
}

func differenceText(d api.Difference) string {
	switch d.What {
	case "config", "version":
		return fmt.Sprintf("%s %s (was %s)", d.Key, d.Value, d.Baseline)
	case "throttle":
		return fmt.Sprintf("%s throttling on %s", d.Key, d.Value)
	}
	return fmt.Sprintf("%s %s (was %s)", strings.ReplaceAll(d.What, "_", " "), d.Value, d.Baseline)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// regression fires when the run's comparison with its baseline
// (Rows.Regression, computed by the query server) found a figure worse
// beyond the baseline's spread.
func regression(cfg Config, in Rows) []Firing {
	r := in.Regression
	if r == nil || !r.Regressed {
		return nil
	}
	var value, th float64
	for _, f := range r.Figures {
		if f.Worse && f.DeltaPct != nil {
			value, th = math.Abs(float64(*f.DeltaPct)), float64(*f.ThresholdPct)
			break
		}
	}
	return []Firing{{Kind: api.AlertRegression, Value: value, Threshold: th, Text: r.Sentence, At: in.Now}}
}

func meanSD(v []float64) (mean, sd float64) {
	for _, x := range v {
		mean += x
	}
	mean /= float64(len(v))
	if len(v) < 2 {
		return mean, 0
	}
	for _, x := range v {
		sd += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(sd / float64(len(v)-1))
}

func meanOf(base []RunProfile, get func(RunProfile) (float64, bool)) float64 {
	var vals []float64
	for _, b := range base {
		if v, ok := get(b); ok && finiteF(v) {
			vals = append(vals, v)
		}
	}
	if len(vals) == 0 {
		return math.NaN()
	}
	m, _ := meanSD(vals)
	return m
}

func finiteF(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func fv(v float64) *api.Float { f := api.Float(v); return &f }

func fpF(v *float64) *api.Float {
	if v == nil {
		return nil
	}
	return fv(*v)
}
