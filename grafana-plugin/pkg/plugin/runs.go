package plugin

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// runsQuery is the runs table: every page of GET /runs, filtered by the
// query's project, sweep, tag and status.
var runsQuery = queryFunc(func(ctx context.Context, d *Datasource, r request) (data.Frames, error) {
	p := params{}
	p.set("project", r.Project)
	p.set("sweep", r.Sweep)
	p.set("tag", r.Tag)
	p.set("status", r.Status)
	runs, err := d.listRuns(ctx, url.Values(p))
	if err != nil {
		return nil, err
	}
	return data.Frames{runsFrame("runs", runs, r.now)}, nil
})

// runsFrame is the runs table; run_summary is the same frame with one row,
// for the stat panels of the summary cards.
// A running run silent for long reads so (api.RunSummary.ShownStatus).
func runsFrame(name string, runs []api.RunSummary, now time.Time) *data.Frame {
	return data.NewFrame(name,
		strCol(runs, "run_id", "Run ID", func(r api.RunSummary) string { return r.RunID }),
		strCol(runs, "name", "Run", func(r api.RunSummary) string { return r.Name }),
		strCol(runs, "project", "Project", func(r api.RunSummary) string { return r.Project }),
		strCol(runs, "status", "Status", func(r api.RunSummary) string { return r.ShownStatus(now) }),
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
		numCol(runs, "peak_gpu_mem_gb", "decgbytes", api.PeakNVMLDisplay, func(r api.RunSummary) *float64 { return fp(r.PeakGPUMemGB) }),
		numCol(runs, "peak_gpu_mem_alloc_gb", "decgbytes", api.PeakAllocDisplay, func(r api.RunSummary) *float64 { return fp(r.PeakGPUMemAllocGB) }),
		numCol(runs, "mean_step_ms", "ms", "Mean step time", func(r api.RunSummary) *float64 { return fp(r.MeanStepMS) }),
		numCol(runs, "mean_tflops", "suffix: TFLOP/s", "Mean TFLOP/s per GPU", func(r api.RunSummary) *float64 { return fp(r.MeanTFLOPS) }),
		numCol(runs, "mean_mfu", "percentunit", "Mean MFU", func(r api.RunSummary) *float64 { return fp(r.MeanMFU) }),
		intCol(runs, "skipped_steps", "Skipped steps", func(r api.RunSummary) *int64 { return i64(r.SkippedSteps) }),
		intCol(runs, "total_steps", "Total steps", func(r api.RunSummary) *int64 { return r.TotalSteps }),
		numCol(runs, "eta_s", "s", "Est. time to finish", func(r api.RunSummary) *float64 { return fp(r.ETASeconds) }),
		timeCol(runs, "eta_at", "Est. finish", func(r api.RunSummary) *time.Time { return r.ETAAt }),
	)
}

// listRunsPage is the page size of GET /runs; maxRuns bounds how many
// runs a table or variable lists.
const (
	listRunsPage = 500
	maxRuns      = 10000
)

// listRuns pages through GET /runs with the given filters.
func (d *Datasource) listRuns(ctx context.Context, filter url.Values) ([]api.RunSummary, error) {
	var all []api.RunSummary
	for offset := 0; offset < maxRuns; {
		p := url.Values{}
		for k, v := range filter {
			p[k] = v
		}
		p.Set("limit", strconv.Itoa(listRunsPage))
		p.Set("offset", strconv.Itoa(offset))
		var page api.RunList
		if err := d.client.get(ctx, "/api/v1/runs", p, &page); err != nil {
			return nil, err
		}
		all = append(all, page.Runs...)
		offset += len(page.Runs)
		if len(page.Runs) == 0 || offset >= page.Total {
			break
		}
	}
	if all == nil {
		all = []api.RunSummary{}
	}
	return all, nil
}
