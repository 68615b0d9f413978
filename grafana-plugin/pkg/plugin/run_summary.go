package plugin

import (
	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// runSummaryQuery is the summary cards of a run, from GET /runs/{id}: the
// runs table of one row or, numeric, a field per figure.
var runSummaryQuery = get[api.RunDetail]{
	path: runPathOf(""),
	frames: func(r request, rd api.RunDetail) data.Frames {
		if r.Format == api.FormatNumeric {
			return data.Frames{summaryNumericFrame(rd.RunSummary)}
		}
		return data.Frames{runsFrame("run_summary", []api.RunSummary{rd.RunSummary}, r.now)}
	},
}

// summaryNumericFrame is run_summary for alert rules: the run's numeric
// figures, each labelled with the run's id, name and project. An alert on
// final_loss or skipped_steps of $run (or of a fixed run id) reads it.
func summaryNumericFrame(r api.RunSummary) *data.Frame {
	labels := data.Labels{"run_id": r.RunID, "run": r.Name, "project": r.Project}
	return numericFrame("run_summary", []*data.Field{
		numericField("duration_s", "s", labels, fp(r.DurationS)),
		numericField("last_step", "none", labels, i64f(r.LastStep)),
		numericField("final_loss", "none", labels, fp(r.FinalLoss)),
		numericField("best_val_accuracy", "percentunit", labels, fp(r.BestValAccuracy)),
		numericField("final_val_loss", "none", labels, fp(r.FinalValLoss)),
		numericField("mean_throughput_sps", "suffix: samples/s", labels, fp(r.MeanThroughputSPS)),
		numericField("mean_gpu_util_pct", "percent", labels, fp(r.MeanGPUUtilPct)),
		numericField("peak_gpu_mem_gb", "decgbytes", labels, fp(r.PeakGPUMemGB)),
		numericField("peak_gpu_mem_alloc_gb", "decgbytes", labels, fp(r.PeakGPUMemAllocGB)),
		numericField("mean_step_ms", "ms", labels, fp(r.MeanStepMS)),
		numericField("mean_tflops", "suffix: TFLOP/s", labels, fp(r.MeanTFLOPS)),
		numericField("mean_mfu", "percentunit", labels, fp(r.MeanMFU)),
		numericField("skipped_steps", "none", labels, i64f(&r.SkippedSteps)),
		numericField("eta_s", "s", labels, fp(r.ETASeconds)),
	})
}
