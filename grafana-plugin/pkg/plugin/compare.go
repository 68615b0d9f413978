package plugin

import (
	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// compareQuery is the comparison table, from GET /compare: the query's
// runs, else its sweep's, else its project's.
var compareQuery = get[api.CompareResponse]{
	path: pathOf("/api/v1/compare"),
	params: func(r request) params {
		p := params{}
		p.add("run", compareRuns(r.PluginQuery))
		p.set("sweep", r.Sweep)
		if len(p["run"]) == 0 && r.Sweep == "" {
			p.set("project", r.Project)
		}
		p.set("baseline", r.Baseline)
		return p
	},
	frames: func(_ request, c api.CompareResponse) data.Frames { return data.Frames{compareFrame(c)} },
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

// compareRunLabels names the compared runs, equal names told apart.
func compareRunLabels(rows []api.CompareRow) []string {
	ids, names := make([]string, len(rows)), make([]string, len(rows))
	for i, r := range rows {
		ids[i], names[i] = r.RunID, r.Name
	}
	return runLabels(ids, names)
}

// compareFrame is the comparison table: configuration columns, then the
// figures, then (with a baseline) each figure's change in percent.
func compareFrame(c api.CompareResponse) *data.Frame {
	rows := c.Rows
	fields := []*data.Field{
		strCol(rows, "run_id", "Run ID", func(r api.CompareRow) string { return r.RunID }),
		withConfig(data.NewField("name", nil, compareRunLabels(rows)), "", "Run"),
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

// compareRuns gives the run ids of a compare query. A multi-value run
// variable may arrive as one "{a,b}" or "a,b" string; it is split here.
func compareRuns(q api.PluginQuery) []string {
	ids := q.RunIDs
	if len(ids) == 0 && q.RunID != "" {
		ids = []string{q.RunID}
	}
	return splitList(ids)
}
