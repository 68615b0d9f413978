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
	tsListEnd     = "];\n"
	gpuListHeader = "/**\n * GPU sample metrics of the gpus query: the metric table's (api.GPUMetrics), written by\n" +
		" * go test ./grafana-plugin/pkg/plugin -run TestTypesListGPUMetrics -update\n */\n"
	stepListBegin  = "export const STEP_METRICS = [\n"
	stepListHeader = "/**\n * Step metrics the query service serves as series (the step table's, api.StepFields, and the\n" +
		" * per-rank series); users add metrics.NAME. Written by\n" +
		" * go test ./grafana-plugin/pkg/plugin -run TestTypesListStepMetrics -update\n */\n"
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
	checkTypesList(t, gpuListHeader+gpuListBegin, gpuPickerMetrics(), "TestTypesListGPUMetrics")
}

// The query editor's list of step metrics (src/types.ts) is the one the
// backend accepts: the step table's series and the per-rank series.
func TestTypesListStepMetrics(t *testing.T) {
	checkTypesList(t, stepListHeader+stepListBegin, stepMetrics, "TestTypesListStepMetrics")
}

// checkTypesList holds the list of types.ts that begins with begin (a
// comment, then "export const NAME = [") to names, or with -update
// writes it.
func checkTypesList(t *testing.T, begin string, names []string, test string) {
	t.Helper()
	b, err := os.ReadFile(typesTS)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	decl := begin[strings.Index(begin, "export const"):]
	i := strings.Index(s, decl)
	if i < 0 {
		t.Fatalf("%s has no %q", typesTS, decl)
	}
	j := i + strings.Index(s[i:], tsListEnd)
	h := strings.LastIndex(s[:i], "/**")
	if h < 0 || j < i {
		t.Fatalf("%s: no comment before %q, or no end to it", typesTS, decl)
	}
	var list strings.Builder
	list.WriteString(begin)
	for _, m := range names {
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
		t.Errorf("%s's %s is not the table's; run go test ./grafana-plugin/pkg/plugin -run %s -update", typesTS, strings.TrimSpace(decl), test)
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
