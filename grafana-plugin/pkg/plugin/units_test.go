package plugin

import (
	"os"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/api"
)

const (
	typesTS       = "../../src/types.ts"
	gpuListBegin  = "export const GPU_METRICS = [\n"
	gpuListEnd    = "];\n"
	gpuListHeader = "/**\n * GPU sample metrics of the gpus query: the metric table's (api.GPUMetrics), written by\n" +
		" * go test ./grafana-plugin/pkg/plugin -run TestTypesListGPUMetrics -update\n */\n"
)

// gpuPickerMetrics are the GPU metrics the query editor offers: the
// stored values a bucket averages, in the metric table's order.
func gpuPickerMetrics() []string {
	var out []string
	for _, m := range api.GPUColumns() {
		if m.Agg == api.AggMean {
			out = append(out, m.Name)
		}
	}
	return out
}

// The query editor's list of GPU metrics (src/types.ts) is the metric
// table's.
func TestTypesListGPUMetrics(t *testing.T) {
	b, err := os.ReadFile(typesTS)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, gpuListBegin)
	if i < 0 {
		t.Fatalf("%s has no %q", typesTS, gpuListBegin)
	}
	j := i + strings.Index(s[i:], gpuListEnd)
	h := strings.LastIndex(s[:i], "/**")
	if h < 0 || j < i {
		t.Fatalf("%s: no comment before GPU_METRICS, or no end to it", typesTS)
	}
	var list strings.Builder
	list.WriteString(gpuListHeader + gpuListBegin)
	for _, m := range gpuPickerMetrics() {
		list.WriteString("  '" + m + "',\n")
	}
	want := s[:h] + list.String() + s[j:]
	if *update {
		if err := os.WriteFile(typesTS, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if s != want {
		t.Errorf("%s's GPU_METRICS is not the metric table's; run go test ./grafana-plugin/pkg/plugin -run TestTypesListGPUMetrics -update", typesTS)
	}
}

// A GPU sample metric's legend is the table's label.
func TestGPUMetricLegendsAreTheTables(t *testing.T) {
	for _, m := range api.GPUColumns() {
		if got := api.MetricLabel(m.Name); got != m.Label || got == "" {
			t.Errorf("legend of %s = %q, want the table's %q", m.Name, got, m.Label)
		}
	}
	if got := api.MetricLabel("step_ms"); got != "step" {
		t.Errorf("legend of step_ms = %q", got)
	}
}
