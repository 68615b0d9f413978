package plugin

import (
	"strconv"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// FormatNumeric is the query format ([api.PluginQuery.Format]) of frames
// for alert rules: Grafana's alerting reads numbers with labels (the data
// plane's numeric-wide format) and rejects the long tables of run_summary
// and ranks, whose string and time columns it cannot place.
const FormatNumeric = "numeric"

// numericField is one number of a numeric-wide frame.
func numericField(name, unit string, labels data.Labels, v *float64) *data.Field {
	return data.NewField(name, labels, []*float64{v}).SetConfig(&data.FieldConfig{Unit: unit})
}

func numericFrame(name string, fields []*data.Field) *data.Frame {
	f := data.NewFrame(name, fields...)
	f.Meta = &data.FrameMeta{Type: data.FrameTypeNumericWide, TypeVersion: data.FrameTypeVersion{0, 1}}
	return f
}

func i64f(v *int64) *float64 {
	if v == nil {
		return nil
	}
	f := float64(*v)
	return &f
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

// ranksNumericFrame is ranks for alert rules: each rank's figures as
// number fields labelled run_id, rank and host, straggler as 1 or 0; an
// alert on straggler > 0 fires once per straggling rank.
func ranksNumericFrame(runID string, r api.RanksResponse) *data.Frame {
	var fields []*data.Field
	for _, s := range r.Ranks {
		labels := data.Labels{"run_id": runID, "rank": strconv.Itoa(s.Rank), "host": s.Host}
		straggler := 0.0
		if s.Straggler {
			straggler = 1
		}
		fields = append(fields,
			numericField("median_step_ms", "ms", labels, fv(s.MedianStepMS)),
			numericField("p95_step_ms", "ms", labels, fv(s.P95StepMS)),
			numericField("wait_ms", "ms", labels, fv(s.WaitMS)),
			numericField("lateness_ms", "ms", labels, fp(s.LatenessMS)),
			numericField("straggler_score", "percentunit", labels, fp(s.StragglerScore)),
			numericField("mean_gpu_util_pct", "percent", labels, fp(s.MeanGPUUtil)),
			numericField("peak_gpu_mem_gb", "decgbytes", labels, fp(s.PeakMemGB)),
			numericField("straggler", "none", labels, &straggler),
		)
	}
	return numericFrame("ranks", fields)
}

// alertsNumericFrame is alerts for alert rules: one number field per open
// alert, 1, labelled run_id, project, kind, subject and
// rank. A Grafana rule on it fires once per open alert and resolves when
// the server resolves the alert; no open alert is an empty frame, which a
// rule reads as no data (provision it as OK).
func alertsNumericFrame(r api.AlertList) *data.Frame {
	fields := make([]*data.Field, 0, len(r.Alerts))
	for _, a := range r.Alerts {
		labels := data.Labels{"run_id": a.RunID, "project": a.Project, "kind": a.Kind, "subject": a.Subject}
		if a.Rank != nil {
			labels["rank"] = strconv.Itoa(*a.Rank)
		}
		v := 1.0 // the detector's own value may be NaN (a non-finite loss)
		fields = append(fields, numericField("alert", "none", labels, &v))
	}
	return numericFrame("alerts", fields)
}
