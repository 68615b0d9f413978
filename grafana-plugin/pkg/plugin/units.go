package plugin

import (
	"strings"

	"github.com/deepseed/deepseed/api"
)

// metricUnit returns the Grafana unit of a metric, from the unit the
// server gives or, when it gives none, the GPU metric table's, else from
// the metric's name.
func metricUnit(metric, serverUnit string) string {
	if serverUnit != "" {
		return api.GrafanaUnit(serverUnit)
	}
	if m := api.GPUMetricNamed(metric); m != nil {
		return api.GrafanaUnit(m.Unit)
	}
	switch {
	case strings.HasSuffix(metric, "_ms"):
		return "ms"
	case strings.HasSuffix(metric, "_pct"):
		return "percent"
	case strings.HasSuffix(metric, "_gb"):
		return "decgbytes"
	case strings.HasSuffix(metric, "_mb"):
		return "decmbytes"
	case strings.HasSuffix(metric, "_bytes"):
		return "decbytes"
	case strings.HasSuffix(metric, "_sps"):
		return "suffix: samples/s"
	}
	return "none"
}

// metricLabels are the legends of the step metrics, in words: a chart's
// legend says "step time", not step_ms. The GPU sample metrics' legends
// are the metric table's (api.GPUMetrics). A metric not listed
// (metrics.NAME, a new column) keeps its name.
var metricLabels = map[string]string{
	"loss": "loss", "lr": "learning rate", "grad_norm": "gradient norm", "loss_scale": "loss scale",
	"epoch": "epoch", "samples": "samples", "tokens": "tokens",
	"throughput_sps": "samples/s", "throughput_tps": "tokens/s",
	"step_ms": "step", "forward_ms": "forward", "backward_ms": "backward", "optimizer_ms": "optimizer",
	"comm_ms": "communication", "data_ms": "data loading",
	"gpu_util_pct": "GPU utilisation (steps)", "gpu_mem_used_gb": "GPU memory used (steps)",
	"gpu_mem_peak_gb": "peak allocated (PyTorch)", "gpu_mem_reserved_gb": "reserved (PyTorch)",
	"cpu_util_pct": "CPU utilisation", "tflops": "TFLOP/s", "mfu": "MFU",
	"sync_wait_ms": "wait in collective", "input_wait_ms": "input wait", "skipped": "skipped",
	"lateness_ms": "lateness", "straggler_score": "straggler score",
}

// metricLabel is a metric's legend in words.
func metricLabel(metric string) string {
	if l, ok := metricLabels[metric]; ok {
		return l
	}
	if m := api.GPUMetricNamed(metric); m != nil && m.Label != "" {
		return m.Label
	}
	return metric
}
