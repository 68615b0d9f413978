package api

import "testing"

// TestGrafanaUnitKnowsTheTable holds the GPU metric table to the unit
// vocabulary: every unit a row names has its Grafana unit id.
func TestGrafanaUnitKnowsTheTable(t *testing.T) {
	for _, m := range GPUMetrics {
		if _, ok := grafanaUnits[m.Unit]; !ok {
			t.Errorf("GPU metric %q: unit %q has no Grafana unit id in grafanaUnits", m.Name, m.Unit)
		}
	}
	for in, want := range map[string]string{"": "none", "ms": "ms", "percent": "percent", "GB": "decgbytes",
		"bytes": "decbytes", "W": "watt", "celsius": "celsius", "MHz": "suffix: MHz", "bytes/s": "Bps", "furlongs": "suffix: furlongs"} {
		if got := GrafanaUnit(in); got != want {
			t.Errorf("GrafanaUnit(%q) = %q, want %q", in, got, want)
		}
	}
}
