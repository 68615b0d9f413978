package plugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// This file turns query-service answers into data frames, one function per
// query type. It computes nothing: values pass through as the server sent
// them, with units and display names attached. The heatmap's colour range
// is the one exception (heatmap.go).

// Column helpers build one field from a slice of rows.

func strCol[T any](rows []T, name, display string, get func(T) string) *data.Field {
	v := make([]string, len(rows))
	for i, r := range rows {
		v[i] = get(r)
	}
	return withConfig(data.NewField(name, nil, v), "", display)
}

func numCol[T any](rows []T, name, unit, display string, get func(T) *float64) *data.Field {
	v := make([]*float64, len(rows))
	for i, r := range rows {
		v[i] = get(r)
	}
	return withConfig(data.NewField(name, nil, v), unit, display)
}

func intCol[T any](rows []T, name, display string, get func(T) *int64) *data.Field {
	v := make([]*int64, len(rows))
	for i, r := range rows {
		v[i] = get(r)
	}
	return withConfig(data.NewField(name, nil, v), "none", display)
}

func timeCol[T any](rows []T, name, display string, get func(T) *time.Time) *data.Field {
	v := make([]*time.Time, len(rows))
	for i, r := range rows {
		v[i] = get(r)
	}
	return withConfig(data.NewField(name, nil, v), "", display)
}

func boolCol[T any](rows []T, name, display string, get func(T) bool) *data.Field {
	v := make([]bool, len(rows))
	for i, r := range rows {
		v[i] = get(r)
	}
	return withConfig(data.NewField(name, nil, v), "", display)
}

func withConfig(f *data.Field, unit, display string) *data.Field {
	if unit == "" && display == "" {
		return f
	}
	return f.SetConfig(&data.FieldConfig{Unit: unit, DisplayNameFromDS: display})
}

func fp(f *api.Float) *float64 {
	if f == nil {
		return nil
	}
	v := float64(*f)
	return &v
}

func fv(f api.Float) *float64 { v := float64(f); return &v }

func ip(i *int) *int64 {
	if i == nil {
		return nil
	}
	v := int64(*i)
	return &v
}

func i64(i int64) *int64 { return &i }

// FrameTypeHeatmapRows is the frame type Grafana's Heatmap panel reads as
// ready-made rows (x first, then one numeric field per y bucket). The SDK
// has no constant for it.
const FrameTypeHeatmapRows data.FrameType = "heatmap-rows"

// timeSeriesMeta marks a frame of the data plane's multi-frame time series
// format, which alerting and recorded queries read.
func timeSeriesMeta() *data.FrameMeta {
	return &data.FrameMeta{Type: data.FrameTypeTimeSeriesMulti, TypeVersion: data.FrameTypeVersion{0, 1}}
}

// runsFrame is the runs table; run_summary is the same frame with one row,
// for the stat panels of the summary cards.
func runsFrame(name string, runs []api.RunSummary) *data.Frame {
	return data.NewFrame(name,
		strCol(runs, "run_id", "Run ID", func(r api.RunSummary) string { return r.RunID }),
		strCol(runs, "name", "Run", func(r api.RunSummary) string { return r.Name }),
		strCol(runs, "project", "Project", func(r api.RunSummary) string { return r.Project }),
		strCol(runs, "status", "Status", func(r api.RunSummary) string { return r.Status }),
		strCol(runs, "tags", "Tags", func(r api.RunSummary) string { return strings.Join(r.Tags, ", ") }),
		strCol(runs, "sweep_id", "Sweep", func(r api.RunSummary) string { return r.SweepID }),
		timeCol(runs, "started_at", "Started", func(r api.RunSummary) *time.Time { return r.StartedAt }),
		timeCol(runs, "ended_at", "Ended", func(r api.RunSummary) *time.Time { return r.EndedAt }),
		numCol(runs, "duration_s", "s", "Duration", func(r api.RunSummary) *float64 { return fp(r.DurationS) }),
		timeCol(runs, "last_seen_at", "Last seen", func(r api.RunSummary) *time.Time { return r.LastSeenAt }),
		strCol(runs, "model", "Model", func(r api.RunSummary) string { return r.Model }),
		numCol(runs, "param_count", "short", "Parameters", func(r api.RunSummary) *float64 {
			if r.ParamCount == nil {
				return nil
			}
			v := float64(*r.ParamCount)
			return &v
		}),
		strCol(runs, "gpu", "GPU", func(r api.RunSummary) string { return r.GPU }),
		intCol(runs, "zero_stage", "ZeRO stage", func(r api.RunSummary) *int64 { return ip(r.ZeroStage) }),
		strCol(runs, "precision", "Precision", func(r api.RunSummary) string { return r.Precision }),
		intCol(runs, "micro_batch", "Micro batch", func(r api.RunSummary) *int64 { return ip(r.MicroBatch) }),
		intCol(runs, "grad_accum", "Grad accumulation", func(r api.RunSummary) *int64 { return ip(r.GradAccum) }),
		intCol(runs, "effective_batch", "Effective batch", func(r api.RunSummary) *int64 { return ip(r.EffectiveBatch) }),
		intCol(runs, "world_size", "World size", func(r api.RunSummary) *int64 { return ip(r.WorldSize) }),
		intCol(runs, "pipeline_stages", "Pipeline stages", func(r api.RunSummary) *int64 { return ip(r.PipelineStages) }),
		strCol(runs, "offload_optimizer", "Optimizer offload", func(r api.RunSummary) string { return r.OffloadOptim }),
		strCol(runs, "offload_params", "Parameter offload", func(r api.RunSummary) string { return r.OffloadParams }),
		intCol(runs, "steps", "Steps", func(r api.RunSummary) *int64 { return i64(r.Steps) }),
		intCol(runs, "last_step", "Last step", func(r api.RunSummary) *int64 { return r.LastStep }),
		numCol(runs, "final_loss", "none", "Final loss", func(r api.RunSummary) *float64 { return fp(r.FinalLoss) }),
		numCol(runs, "best_val_accuracy", "percentunit", "Best val accuracy", func(r api.RunSummary) *float64 { return fp(r.BestValAccuracy) }),
		numCol(runs, "final_val_accuracy", "percentunit", "Final val accuracy", func(r api.RunSummary) *float64 { return fp(r.FinalValAccuracy) }),
		numCol(runs, "best_val_f1", "percentunit", "Best val F1", func(r api.RunSummary) *float64 { return fp(r.BestValF1) }),
		numCol(runs, "final_val_f1", "percentunit", "Final val F1", func(r api.RunSummary) *float64 { return fp(r.FinalValF1) }),
		numCol(runs, "final_val_loss", "none", "Final val loss", func(r api.RunSummary) *float64 { return fp(r.FinalValLoss) }),
		numCol(runs, "mean_throughput_sps", "suffix: samples/s", "Mean throughput", func(r api.RunSummary) *float64 { return fp(r.MeanThroughputSPS) }),
		numCol(runs, "mean_gpu_util_pct", "percent", "Mean GPU util", func(r api.RunSummary) *float64 { return fp(r.MeanGPUUtilPct) }),
		numCol(runs, "peak_gpu_mem_gb", "decgbytes", PeakNVMLDisplay, func(r api.RunSummary) *float64 { return fp(r.PeakGPUMemGB) }),
		numCol(runs, "peak_gpu_mem_alloc_gb", "decgbytes", PeakAllocDisplay, func(r api.RunSummary) *float64 { return fp(r.PeakGPUMemAllocGB) }),
		numCol(runs, "mean_step_ms", "ms", "Mean step time", func(r api.RunSummary) *float64 { return fp(r.MeanStepMS) }),
		numCol(runs, "mean_tflops", "suffix: TFLOP/s", "Mean TFLOP/s per GPU", func(r api.RunSummary) *float64 { return fp(r.MeanTFLOPS) }),
		numCol(runs, "mean_mfu", "percentunit", "Mean MFU", func(r api.RunSummary) *float64 { return fp(r.MeanMFU) }),
		intCol(runs, "skipped_steps", "Skipped steps", func(r api.RunSummary) *int64 { return i64(r.SkippedSteps) }),
		intCol(runs, "total_steps", "Total steps", func(r api.RunSummary) *int64 { return r.TotalSteps }),
		numCol(runs, "eta_s", "s", "Est. time to finish", func(r api.RunSummary) *float64 { return fp(r.ETASeconds) }),
		timeCol(runs, "eta_at", "Est. finish", func(r api.RunSummary) *time.Time { return r.ETAAt }),
	)
}

// kv is one row of the run-details table.
type kv struct{ section, key, value string }

// runDetailsFrame is the seed's "training notebook" as key/value rows:
// identity, command, git commit, versions, then hyper-parameters, config
// and meta flattened to dotted keys.
func runDetailsFrame(d api.RunDetail) *data.Frame {
	rows := []kv{
		{"run", "run_id", d.RunID},
		{"run", "name", d.Name},
		{"run", "project", d.Project},
		{"run", "status", d.Status},
		{"run", "host", d.Host},
		{"run", "command", d.Command},
		{"run", "git_commit", d.GitCommit},
	}
	if d.StartedAt != nil {
		rows = append(rows, kv{"run", "started_at", d.StartedAt.UTC().Format(time.RFC3339)})
	}
	if len(d.Ranks) > 0 {
		r := make([]string, len(d.Ranks))
		for i, n := range d.Ranks {
			r[i] = strconv.Itoa(n)
		}
		rows = append(rows, kv{"run", "ranks", strings.Join(r, ", ")})
	}
	for _, k := range slices.Sorted(maps.Keys(d.Versions)) {
		rows = append(rows, kv{"versions", k, d.Versions[k]})
	}
	rows = flattenJSON(rows, "params", "", d.Params)
	rows = flattenJSON(rows, "config", "", d.Config)
	rows = flattenJSON(rows, "meta", "", d.Meta)
	rows = flattenJSON(rows, "summary", "", d.Summary)
	return data.NewFrame("run_details",
		strCol(rows, "section", "Section", func(r kv) string { return r.section }),
		strCol(rows, "key", "Key", func(r kv) string { return r.key }),
		strCol(rows, "value", "Value", func(r kv) string { return r.value }),
	)
}

// flattenJSON appends one row per leaf of raw, objects flattened to dotted
// keys in sorted order; arrays stay as compact JSON, as people write them.
func flattenJSON(rows []kv, section, prefix string, raw json.RawMessage) []kv {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return rows
	}
	if raw[0] == '{' {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err == nil {
			for _, k := range slices.Sorted(maps.Keys(obj)) {
				key := k
				if prefix != "" {
					key = prefix + "." + k
				}
				rows = flattenJSON(rows, section, key, obj[k])
			}
			return rows
		}
	}
	value := string(raw)
	var s string
	if raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
		value = s
	} else {
		var buf bytes.Buffer
		if json.Compact(&buf, raw) == nil {
			value = buf.String()
		}
	}
	if prefix == "" {
		prefix = section
	}
	return append(rows, kv{section, prefix, value})
}

// seriesFrames gives one frame per metric and rank: x (time, or step for
// the trend panel), the value, and optionally the bucket's min and max.
// On a run of more than api.MaxRankSeries ranks, rank=all answers the
// ranks' distribution (spreadFrames, first) and the series of the ranks
// the server picked; its notice says so on the first frame. The series of
// a rank in flagged end their display name with StragglerSuffix.
func seriesFrames(q api.PluginQuery, r api.SeriesResponse, flagged map[int]bool) data.Frames {
	ranks := map[int]bool{}
	for _, s := range r.Series {
		ranks[s.Rank] = true
	}
	perRank := q.Rank == "all" || len(ranks) > 1
	frames := spreadFrames(q, r)
	for _, s := range r.Series {
		display := metricLabel(s.Metric)
		if perRank {
			display = fmt.Sprintf("%s rank %d", display, s.Rank)
			if flagged[s.Rank] {
				display += StragglerSuffix
			}
		}
		unit := metricUnit(s.Metric, s.Unit)
		labels := data.Labels{"rank": strconv.Itoa(s.Rank)}
		n := len(s.Points)
		val, lo, hi := make([]float64, n), make([]float64, n), make([]float64, n)
		for i, p := range s.Points {
			val[i], lo[i], hi[i] = float64(p.Value), float64(p.Min), float64(p.Max)
		}
		fields := []*data.Field{xField(q.XAxis, s.Points)}
		if q.WithStep && q.XAxis != "step" {
			fields = append(fields, stepField(s.Points))
		}
		fields = append(fields, data.NewField(s.Metric, labels, val).SetConfig(&data.FieldConfig{Unit: unit, DisplayNameFromDS: display}))
		if marks := nonFiniteMarks(val); marks != nil {
			fields = append(fields, data.NewField(s.Metric+"_non_finite", labels, marks).
				SetConfig(&data.FieldConfig{Unit: unit, DisplayNameFromDS: display + NonFiniteSuffix}))
		}
		if q.MinMax {
			fields = append(fields,
				data.NewField(s.Metric+"_min", labels, lo).SetConfig(&data.FieldConfig{Unit: unit, DisplayNameFromDS: display + " min"}),
				data.NewField(s.Metric+"_max", labels, hi).SetConfig(&data.FieldConfig{Unit: unit, DisplayNameFromDS: display + " max"}))
		}
		f := data.NewFrame(display, fields...)
		if q.XAxis != "step" && !q.MinMax && !q.WithStep {
			f.Meta = timeSeriesMeta()
		} else {
			f.Meta = &data.FrameMeta{}
		}
		f.Meta.Custom = map[string]any{"bucket_steps": s.BucketSteps}
		frames = append(frames, f)
	}
	return withNotice(frames, "series", r.Notice)
}

// StragglerSuffix ends the display name of the series of a rank the
// server flags as a straggler, for dashboards to highlight by name.
const StragglerSuffix = " (straggler)"

// NonFiniteSuffix ends the display name of the field that marks a
// series' NaN and infinite values (see nonFiniteMarks).
const NonFiniteSuffix = " not finite"

// nonFiniteMarks marks where a series is NaN or infinite, which a line
// chart leaves as a gap: a point at the last finite value before it (0
// when none), nothing elsewhere, so the chart can draw it as a red dot
// with the line. Nil when every value is finite.
func nonFiniteMarks(val []float64) []*float64 {
	var marks []*float64
	last := 0.0
	for i, v := range val {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			last = v
			continue
		}
		if marks == nil {
			marks = make([]*float64, len(val))
		}
		at := last
		marks[i] = &at
	}
	return marks
}

// stepField is the step of each point beside a time axis: shown in the
// tooltip and hidden from the chart and its legend, so a time chart can be
// read by step.
func stepField(pts []api.Point) *data.Field {
	v := make([]int64, len(pts))
	for i, p := range pts {
		v[i] = p.Step
	}
	return data.NewField("step", nil, v).SetConfig(&data.FieldConfig{
		DisplayNameFromDS: "Step",
		Unit:              "none",
		Custom:            map[string]any{"hideFrom": map[string]any{"viz": true, "legend": true, "tooltip": false}},
	})
}

func xField(axis string, pts []api.Point) *data.Field {
	if axis == "step" {
		v := make([]int64, len(pts))
		for i, p := range pts {
			v[i] = p.Step
		}
		// Labelled as the trend panels' x field and join key name it.
		return data.NewField("step", nil, v).SetConfig(&data.FieldConfig{DisplayNameFromDS: "Step", Unit: "none"})
	}
	v := make([]time.Time, len(pts))
	for i, p := range pts {
		v[i] = p.Time
	}
	return data.NewField("time", nil, v)
}

// evalsFrames gives one frame per split (val, test, …): the points to
// overlay on the loss chart, with the training loss at each.
func evalsFrames(q api.PluginQuery, r api.EvalsResponse) data.Frames {
	var splits []string
	bySplit := map[string][]api.EvalPoint{}
	for _, e := range r.Evals {
		if _, ok := bySplit[e.Split]; !ok {
			splits = append(splits, e.Split)
		}
		bySplit[e.Split] = append(bySplit[e.Split], e)
	}
	frames := make(data.Frames, 0, len(splits))
	for _, split := range splits {
		pts := bySplit[split]
		labels := data.Labels{"split": split}
		var fields []*data.Field
		if q.XAxis == "step" {
			fields = append(fields, intCol(pts, "step", "Step", func(e api.EvalPoint) *int64 { return i64(e.Step) }))
		} else {
			t := make([]time.Time, len(pts))
			for i, e := range pts {
				t[i] = e.Time
			}
			fields = append(fields, data.NewField("time", nil, t),
				intCol(pts, "step", "Step", func(e api.EvalPoint) *int64 { return i64(e.Step) }))
		}
		labeled := func(f *data.Field) *data.Field { f.Labels = labels; return f }
		fields = append(fields,
			labeled(numCol(pts, "loss", "none", split+" loss", func(e api.EvalPoint) *float64 { return fp(e.Loss) })),
			labeled(numCol(pts, "accuracy", "percentunit", split+" accuracy", func(e api.EvalPoint) *float64 { return fp(e.Accuracy) })),
			labeled(numCol(pts, "f1", "percentunit", split+" F1", func(e api.EvalPoint) *float64 { return fp(e.F1) })),
			labeled(numCol(pts, "train_loss", "none", "train loss at "+split, func(e api.EvalPoint) *float64 { return fp(e.TrainLoss) })),
		)
		names := map[string]bool{}
		for _, e := range pts {
			for k := range e.Metrics {
				names[k] = true
			}
		}
		// An evaluation's other figures (an HF Trainer's epoch, runtime,
		// samples per second) are in the tooltip, not drawn: on the loss
		// chart they would land on the loss's or the accuracy's axis.
		for _, k := range slices.Sorted(maps.Keys(names)) {
			f := labeled(numCol(pts, "metrics."+k, "none", split+" "+k, func(e api.EvalPoint) *float64 {
				if v, ok := e.Metrics[k]; ok {
					return fv(v)
				}
				return nil
			}))
			f.Config.Custom = map[string]any{"hideFrom": map[string]any{"viz": true, "legend": true, "tooltip": false}}
			fields = append(fields, f)
		}
		f := data.NewFrame(split, fields...)
		f.Meta = &data.FrameMeta{}
		frames = append(frames, f)
	}
	return frames
}

// breakdownFrame is one row with a field per part, which the pie chart
// draws as slices with their shares.
func breakdownFrame(b api.Breakdown) *data.Frame {
	fields := make([]*data.Field, 0, len(b.Parts))
	for _, p := range b.Parts {
		fields = append(fields, data.NewField(p.Name, nil, []float64{float64(p.MS)}).
			SetConfig(&data.FieldConfig{Unit: "ms", DisplayNameFromDS: p.Name}))
	}
	f := data.NewFrame("breakdown", fields...)
	f.Meta = &data.FrameMeta{Custom: map[string]any{
		"rank": b.Rank, "from_step": b.FromStep, "to_step": b.ToStep, "steps": b.Steps, "step_ms": fv(b.StepMS),
	}}
	return f
}

// The two measured peaks of GPU memory, named by their source wherever
// they are shown: NVML counts the device memory in use (the allocator's
// pool and the CUDA context), the PyTorch allocator its tensors alone.
const (
	PeakNVMLDisplay  = "Peak GPU memory (NVML)"
	PeakAllocDisplay = "Peak allocated (PyTorch)"
)

// memoryFrame is the ZeRO bar chart: a part per row, bytes per device in
// separate fields (so the bars stack by where the state lives), then the
// predicted GPU total and each measured peak, named by its source, as
// bars of their own.
func memoryFrame(m api.MemoryResponse) *data.Frame {
	type row struct {
		name  string
		bytes map[string]*float64
	}
	devices := []string{"gpu"}
	var rows []row
	for _, p := range m.Parts {
		dev := p.Device
		if dev == "" {
			dev = "gpu"
		}
		if !slices.Contains(devices, dev) {
			devices = append(devices, dev)
		}
		rows = append(rows, row{p.Name, map[string]*float64{dev: fv(p.Bytes)}})
	}
	rows = append(rows, row{"predicted GPU", map[string]*float64{"gpu": fv(m.PredictedGPUBytes)}})
	if m.PeakGPUBytes != nil {
		rows = append(rows, row{PeakNVMLDisplay, map[string]*float64{"gpu": fp(m.PeakGPUBytes)}})
	}
	if m.AllocPeakGPUBytes != nil {
		rows = append(rows, row{PeakAllocDisplay, map[string]*float64{"gpu": fp(m.AllocPeakGPUBytes)}})
	}
	fields := []*data.Field{strCol(rows, "part", "Part", func(r row) string { return r.name })}
	for _, dev := range devices {
		fields = append(fields, numCol(rows, dev, "decbytes", strings.ToUpper(dev), func(r row) *float64 { return r.bytes[dev] }))
	}
	f := data.NewFrame("memory", fields...)
	f.Meta = &data.FrameMeta{Custom: map[string]any{"gpu_total_bytes": fp(m.GPUTotalBytes)}}
	return f
}

// compareFigures are the steady-state columns of the comparison table with
// their units; a baseline adds a Δ % column for each.
var compareFigures = []struct {
	key, unit, display string
	get                func(api.CompareRow) *api.Float
}{
	{"gpu_mem_peak_mb", "decmbytes", "GPU mem peak", func(r api.CompareRow) *api.Float { return r.GPUMemPeakMB }},
	{"gpu_mem_mean_mb", "decmbytes", "GPU mem mean", func(r api.CompareRow) *api.Float { return r.GPUMemMeanMB }},
	{"gpu_mem_alloc_peak_mb", "decmbytes", "Allocator peak", func(r api.CompareRow) *api.Float { return r.GPUMemAllocPeakMB }},
	{"gpu_util_pct", "percent", "GPU util", func(r api.CompareRow) *api.Float { return r.GPUUtilPct }},
	{"cpu_util_pct", "percent", "CPU util", func(r api.CompareRow) *api.Float { return r.CPUUtilPct }},
	{"step_time_s", "s", "Step time", func(r api.CompareRow) *api.Float { return r.StepTimeS }},
	{"steps_per_s", "suffix: steps/s", "Steps/s", func(r api.CompareRow) *api.Float { return r.StepsPerS }},
	{"samples_per_s", "suffix: samples/s", "Samples/s", func(r api.CompareRow) *api.Float { return r.SamplesPerS }},
	{"tflops", "suffix: TFLOP/s", "TFLOP/s per GPU", func(r api.CompareRow) *api.Float { return r.TFLOPS }},
	{"mfu", "percentunit", "MFU", func(r api.CompareRow) *api.Float { return r.MFU }},
	{"final_loss", "none", "Final loss", func(r api.CompareRow) *api.Float { return r.FinalLoss }},
	{"best_eval_accuracy", "percentunit", "Best eval accuracy", func(r api.CompareRow) *api.Float { return r.BestEvalAcc }},
	{"wasted_gpu_h", "suffix: GPU·h", "Wasted GPU-hours", func(r api.CompareRow) *api.Float { return r.WastedGPUH }},
}

// compareFrame is the comparison table: configuration columns, then the
// figures, then (with a baseline) each figure's change in percent.
func compareFrame(c api.CompareResponse) *data.Frame {
	rows := c.Rows
	fields := []*data.Field{
		strCol(rows, "run_id", "Run ID", func(r api.CompareRow) string { return r.RunID }),
		strCol(rows, "name", "Run", func(r api.CompareRow) string { return r.Name }),
		strCol(rows, "project", "Project", func(r api.CompareRow) string { return r.Project }),
		strCol(rows, "status", "Status", func(r api.CompareRow) string { return r.Status }),
		strCol(rows, "model", "Model", func(r api.CompareRow) string { return r.Model }),
		intCol(rows, "zero_stage", "ZeRO stage", func(r api.CompareRow) *int64 { return ip(r.ZeroStage) }),
		strCol(rows, "precision", "Precision", func(r api.CompareRow) string { return r.Precision }),
		intCol(rows, "pipeline_stages", "Pipeline stages", func(r api.CompareRow) *int64 { return ip(r.PipelineStages) }),
		strCol(rows, "parallelism", "Parallelism", func(r api.CompareRow) string { return r.Parallelism }),
		strCol(rows, "offload_optimizer", "Optimizer offload", func(r api.CompareRow) string { return r.OffloadOptim }),
		strCol(rows, "offload_params", "Parameter offload", func(r api.CompareRow) string { return r.OffloadParams }),
		intCol(rows, "micro_batch", "Micro batch", func(r api.CompareRow) *int64 { return ip(r.MicroBatch) }),
		intCol(rows, "world_size", "World size", func(r api.CompareRow) *int64 { return ip(r.WorldSize) }),
	}
	for _, fig := range compareFigures {
		fields = append(fields, numCol(rows, fig.key, fig.unit, fig.display, func(r api.CompareRow) *float64 { return fp(fig.get(r)) }))
	}
	fields = append(fields, strCol(rows, "note", "Note", func(r api.CompareRow) string { return r.Note }))
	if c.Baseline != "" {
		for _, fig := range compareFigures {
			fields = append(fields, numCol(rows, "delta_pct."+fig.key, "percent", "Δ "+fig.display, func(r api.CompareRow) *float64 {
				return fp(r.DeltaPct[fig.key])
			}))
		}
	}
	f := data.NewFrame("compare", fields...)
	if c.Baseline != "" {
		f.Meta = &data.FrameMeta{Custom: map[string]any{"baseline": c.Baseline}}
	}
	return f
}

// gpuFrames gives one time series per host, GPU and metric, labelled so
// alert rules get one instance per GPU.
func gpuFrames(r api.GPUResponse) data.Frames {
	metrics := map[string]bool{}
	for _, s := range r.Series {
		metrics[s.Metric] = true
	}
	frames := make(data.Frames, 0, len(r.Series))
	for _, s := range r.Series {
		display := fmt.Sprintf("%s GPU %d", s.Host, s.GPU)
		if len(metrics) > 1 {
			display += " " + metricLabel(s.Metric)
		}
		labels := data.Labels{"host": s.Host, "gpu": strconv.Itoa(s.GPU)}
		if s.Name != "" {
			labels["gpu_name"] = s.Name
		}
		if s.RunID != "" {
			labels["run_id"] = s.RunID
		}
		t := make([]time.Time, len(s.Points))
		v := make([]float64, len(s.Points))
		for i, p := range s.Points {
			t[i], v[i] = p.Time, float64(p.Value)
		}
		f := data.NewFrame(display,
			data.NewField("time", nil, t),
			data.NewField(s.Metric, labels, v).SetConfig(&data.FieldConfig{Unit: metricUnit(s.Metric, s.Unit), DisplayNameFromDS: display}))
		f.Meta = timeSeriesMeta()
		frames = append(frames, f)
	}
	return frames
}

// annotationsFrame has the fields Grafana's annotation support maps by
// name: time, title, text and tags (comma-separated).
func annotationsFrame(r api.AnnotationsResponse) *data.Frame {
	rows := r.Annotations
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Time.Before(rows[j].Time) })
	t := make([]time.Time, len(rows))
	for i, a := range rows {
		t[i] = a.Time
	}
	return data.NewFrame("annotations",
		data.NewField("time", nil, t),
		strCol(rows, "title", "", func(a api.Annotation) string { return a.Title }),
		strCol(rows, "text", "", func(a api.Annotation) string { return a.Text }),
		strCol(rows, "tags", "", func(a api.Annotation) string {
			tags := a.Tags
			if len(tags) == 0 && a.Type != "" {
				tags = []string{a.Type}
			}
			return strings.Join(tags, ",")
		}),
		strCol(rows, "type", "", func(a api.Annotation) string { return a.Type }),
		strCol(rows, "run_id", "", func(a api.Annotation) string { return a.RunID }),
		intCol(rows, "step", "", func(a api.Annotation) *int64 { return a.Step }),
	)
}

// alertsFrame is the open alerts as a table, the newest opened first.
func alertsFrame(r api.AlertList) *data.Frame {
	rows := r.Alerts
	f := data.NewFrame("alerts",
		timeCol(rows, "opened_at", "Opened", func(a api.Alert) *time.Time { return &a.OpenedAt }),
		strCol(rows, "run_id", "Run", func(a api.Alert) string { return a.RunID }),
		strCol(rows, "kind", "Kind", func(a api.Alert) string { return a.Kind }),
		strCol(rows, "subject", "Where", func(a api.Alert) string { return a.Subject }),
		intCol(rows, "step", "Step", func(a api.Alert) *int64 { return a.Step }),
		numCol(rows, "value", "none", "Value", func(a api.Alert) *float64 { return fp(a.Value) }),
		numCol(rows, "threshold", "none", "Threshold", func(a api.Alert) *float64 { return fp(a.Threshold) }),
		strCol(rows, "text", "Alert", func(a api.Alert) string { return a.Text }),
	)
	if len(rows) == 0 {
		f.AppendNotices(data.Notice{Severity: data.NoticeSeverityInfo, Text: "no open alert"})
	}
	return f
}
