package plugin

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

func TestParseQuery(t *testing.T) {
	good := []string{
		`{"queryType":"runs"}`,
		`{"queryType":"runs","project":"$project","refId":"A","datasource":{"type":"deepseed-telemetry-datasource","uid":"x"},"intervalMs":1000}`,
		`{"queryType":"run_summary","runId":"$run"}`,
		`{"queryType":"series","runId":"r","metrics":["loss","metrics.acc","$metric"],"rank":"all","xAxis":"step","minMax":true}`,
		`{"queryType":"series","runId":"r","metrics":["step_ms"],"rank":"${rank}","fromStep":0,"toStep":10}`,
		`{"queryType":"heatmap","runId":"r","pass":"backward","maxSteps":200}`,
		`{"queryType":"compare","runIds":["$run"],"baseline":"a"}`,
		`{"queryType":"compare","sweep":"s"}`,
		`{"queryType":"gpus","host":"$host","gpu":"3","metrics":["util_pct"]}`,
		`{"queryType":"ranks","runId":"r","stragglerPct":10}`,
		`{"queryType":"ranks","runId":"r","part":"hosts"}`,
		`{"queryType":"annotations"}`,
	}
	for _, g := range good {
		if _, err := ParseQuery(json.RawMessage(g)); err != nil {
			t.Errorf("%s: %v", g, err)
		}
	}
	bad := []struct{ query, field string }{
		{``, ""},
		{`[]`, ""},
		{`{}`, "queryType"},
		{`{"queryType":"loss"}`, "queryType"},
		{`{"queryType":"series","runId":"r"}`, "metrics"},
		{`{"queryType":"series","metrics":["loss"]}`, "runId"},
		{`{"queryType":"series","runId":"r","metrics":["los"]}`, "metrics"},
		{`{"queryType":"series","runId":"r","metrics":["metrics."]}`, "metrics"},
		{`{"queryType":"series","runId":"r","metrics":["loss"],"rank":"-1"}`, "rank"},
		{`{"queryType":"series","runId":"r","metrics":["loss"],"xAxis":"epoch"}`, "xAxis"},
		{`{"queryType":"series","runId":"r","metrics":["loss"],"fromStep":5,"toStep":4}`, "toStep"},
		{`{"queryType":"heatmap","runId":"r","pass":"sideways"}`, "pass"},
		{`{"queryType":"heatmap","runId":"r","maxSteps":-1}`, "maxSteps"},
		{`{"queryType":"compare"}`, "runIds"},
		{`{"queryType":"gpus","gpu":"first"}`, "gpu"},
		{`{"queryType":"ranks","runId":"r","stragglerPct":-3}`, "stragglerPct"},
		{`{"queryType":"ranks","runId":"r","part":"gpus"}`, "part"},
		{`{"queryType":"ranks","runId":"r","part":"hosts","format":"numeric"}`, "part"},
		{`{"queryType":"series","runId":"r","metrics":["loss"],"part":"hosts"}`, "part"},
	}
	for _, b := range bad {
		_, err := ParseQuery(json.RawMessage(b.query))
		var qe *QueryError
		if err == nil || !asQueryError(err, &qe) || qe.Field != b.field {
			t.Errorf("%s: want an error on %q, got %v", b.query, b.field, err)
		}
	}
}

func asQueryError(err error, qe **QueryError) bool {
	e, ok := err.(*QueryError)
	*qe = e
	return ok
}

// TestStepMetricsMatchStore keeps the editor's metric list equal to what
// the query service serves.
func TestStepMetricsMatchStore(t *testing.T) {
	want := append(append(slices.Clone(store.StepMetrics), "skipped"), store.RankMetrics...)
	got := slices.Clone(stepMetrics)
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("plugin metrics %v\nstore metrics %v", got, want)
	}
}

func TestGrafanaUnit(t *testing.T) {
	if got := metricUnit("gpu_mem_used_gb", ""); got != "decgbytes" {
		t.Errorf("metricUnit by name: %q", got)
	}
	if got := metricUnit("power_w", ""); got != "watt" {
		t.Errorf("metricUnit of a GPU metric, from the table: %q", got)
	}
	if !strings.HasPrefix(api.QueryHeatmap, "heat") {
		t.Fatal("query type constants changed")
	}
}

// A heatmap the server answers with a notice (no backward timings) shows
// the notice on the panel.
func TestHeatmapNoticeReachesThePanel(t *testing.T) {
	f := heatmapFrame(api.PluginQuery{}, api.Heatmap{RunID: "r", Pass: "backward", Layers: []string{"a", "b"},
		Values: [][]*api.Float{{}, {}}, Notice: "no backward timings: this run's layer records have none for rank 0"})
	if f.Meta == nil || len(f.Meta.Notices) != 1 || !strings.HasPrefix(f.Meta.Notices[0].Text, "no backward timings") {
		t.Fatalf("frame meta %+v, want the server's notice", f.Meta)
	}
	if n, _ := f.RowLen(); n != 0 {
		t.Fatalf("frame has %d rows, want none", n)
	}
	if g := heatmapFrame(api.PluginQuery{}, api.Heatmap{Pass: "forward"}); len(g.Meta.Notices) != 0 {
		t.Fatalf("notices %v without a notice from the server", g.Meta.Notices)
	}
}

// An HF Trainer's evaluation carries its epoch and runtime beside the
// loss: they reach the tooltip but are not drawn on the loss chart's axes.
func TestEvalExtraFiguresStayInTheTooltip(t *testing.T) {
	fr := evalsFrames(api.PluginQuery{XAxis: "step"}, api.EvalsResponse{Evals: []api.EvalPoint{{
		Split: "val", Step: 10, Loss: api.Ptr(api.Float(1.5)), Metrics: map[string]api.Float{"epoch": 1},
	}}})
	for _, f := range fr[0].Fields {
		hidden := f.Config != nil && f.Config.Custom["hideFrom"] != nil
		if want := f.Name == "metrics.epoch"; hidden != want {
			t.Errorf("field %s: hidden %v, want %v", f.Name, hidden, want)
		}
	}
}

// Every query type ParseQuery accepts has its entry in the dispatch
// table, and the table has no other.
func TestQueryTypesTable(t *testing.T) {
	for _, qt := range api.PluginQueryTypes {
		if queryTypes[qt].answer == nil {
			t.Errorf("query type %s has no entry in queryTypes", qt)
		}
	}
	for qt := range queryTypes {
		if !slices.Contains(api.PluginQueryTypes, qt) {
			t.Errorf("queryTypes answers %s, which api.PluginQueryTypes does not list", qt)
		}
	}
}

// The frontend's list of query types (src/types.ts) has every type, and
// needs a run for those the table needs one for: the editor and the
// frontend's check of a query then agree with ParseQuery.
func TestFrontendQueryTypes(t *testing.T) {
	ts, err := os.ReadFile("../../src/types.ts")
	if err != nil {
		t.Fatal(err)
	}
	_, list, _ := strings.Cut(string(ts), "export const QUERY_TYPES")
	list, _, _ = strings.Cut(list, "];")
	entries := regexp.MustCompile(`(?s)value: '(\w+)'.*?needsRun: (true|false)`).FindAllStringSubmatch(list, -1)
	seen := map[string]bool{}
	for _, e := range entries {
		qt, needsRun := e[1], e[2] == "true"
		seen[qt] = true
		if typ, ok := queryTypes[qt]; !ok {
			t.Errorf("types.ts lists query type %s, which the backend does not answer", qt)
		} else if typ.needsRun != needsRun {
			t.Errorf("types.ts: %s needsRun %v, the backend's table %v", qt, needsRun, typ.needsRun)
		}
	}
	for qt := range queryTypes {
		if !seen[qt] {
			t.Errorf("types.ts does not list query type %s", qt)
		}
	}
}
