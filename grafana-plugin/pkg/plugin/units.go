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
