package api

import "strings"

// The names below are what the data source shows and what the provisioned
// dashboards refer to by name (a panel's overrides, a frame picker, a
// variable's All): the plugin writes them into its frames and the
// dashboards match them, so both take them from here and the dashboards
// need not link the plugin.

// Query formats of [PluginQuery.Format] besides the default "".
const (
	// FormatNumeric is the format of frames for alert rules: Grafana's
	// alerting reads numbers with labels (the data plane's numeric-wide
	// format) and rejects the long tables of run_summary and ranks, whose
	// string and time columns it cannot place.
	FormatNumeric = "numeric"
	// FormatTable is the gpus query format of one table row per GPU.
	FormatTable = "table"
)

// GPUTableMetrics are the metrics a per-GPU table asks for.
var GPUTableMetrics = []string{"util_pct", "mem_used_bytes", "mem_total_bytes", "temp_c", "power_w"}

// HangEventTypes are the event types a hang_reports query reads.
var HangEventTypes = []string{EventHang, EventHangGPUs}

// GPUHoursUnit is the Grafana unit of GPU-hour figures.
const GPUHoursUnit = "suffix: GPU-h"

// ConsistentText is what a run that breaks no invariant shows.
const ConsistentText = "All numbers consistent"

// StragglerSuffix ends the display name of the series of a rank the
// server flags as a straggler, for dashboards to highlight by name.
const StragglerSuffix = " (straggler)"

// NonFiniteSuffix ends the display name of the field that marks a
// series' NaN and infinite values.
const NonFiniteSuffix = " not finite"

// The two measured peaks of GPU memory, named by their source wherever
// they are shown: NVML counts the device memory in use (the allocator's
// pool and the CUDA context), the PyTorch allocator its tensors alone.
const (
	PeakNVMLDisplay  = "Peak GPU memory (NVML)"
	PeakAllocDisplay = "Peak allocated (PyTorch)"
)

// The frames of a regression query, by name: the names a table panel's
// frame picker shows.
const (
	RegressionSentenceFrame = "What changed"
	RegressionFiguresFrame  = "Figures against the baseline"
	RegressionPlacesFrame   = "Where: phases, layers, ranks, hosts"
	RegressionDiffersFrame  = "What differs"
)

// rankSeriesLabels are the legends of the per-rank series the query
// service computes across the ranks of a step.
var rankSeriesLabels = map[string]string{"lateness_ms": "lateness", "straggler_score": "straggler score"}

// MetricLabel is a metric's legend in words: a chart's legend says "step",
// not step_ms. A step value's legend is the step table's (StepFields), a
// GPU metric's the metric table's (GPUMetrics); a metric without one
// (metrics.NAME, a value the table gives no label) keeps its name.
func MetricLabel(metric string) string {
	if f := StepFieldNamed(metric); f != nil && f.Label != "" {
		return f.Label
	}
	if l, ok := rankSeriesLabels[metric]; ok {
		return l
	}
	if m := GPUMetricNamed(metric); m != nil && m.Label != "" {
		return m.Label
	}
	return metric
}

// SpreadLabel is the legend, in words, of one quantile of a metric's
// distribution ("Lateness, p95 of ranks"; of an NVML metric, "GPU
// utilisation, p95 of GPUs"), which dashboards name in their overrides (a
// band filled from p5 to p95).
func SpreadLabel(metric, quantile string) string {
	label, of := MetricLabel(metric), "ranks"
	_, rankSeries := rankSeriesLabels[metric]
	if f := StepFieldNamed(metric); (f == nil || f.Label == "") && !rankSeries && GPUMetricNamed(metric) != nil {
		label, of = "GPU "+label, "GPUs"
	}
	if label != "" {
		label = strings.ToUpper(label[:1]) + label[1:]
	}
	return label + ", " + quantile + " of " + of
}
