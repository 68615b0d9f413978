package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/deepseed/deepseed/api"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
	"github.com/grafana/grafana-plugin-sdk-go/data"
	"github.com/grafana/grafana-plugin-sdk-go/experimental"
)

// TestQueryData runs every query type through the gRPC harness against a
// real server holding the fixture runs and compares the frames (types,
// field names, units, values) with the golden files in testdata/.
func TestQueryData(t *testing.T) {
	base := startServer(t)
	ingest(t, base, fixtureRecords())
	tp := startPlugin(t)
	pc := pluginContext("golden", base, readToken)

	cases := []struct{ name, query string }{
		{"runs", `{"queryType":"runs","project":"nlp"}`},
		{"run_summary", `{"queryType":"run_summary","runId":"bert-z2"}`},
		{"run_details", `{"queryType":"run_details","runId":"bert-z2"}`},
		{"run_code", `{"queryType":"run_code","runId":"bert-z2"}`},
		{"series_time", `{"queryType":"series","runId":"bert-z2","metrics":["loss","step_ms"]}`},
		{"series_step_minmax", `{"queryType":"series","runId":"bert-z2","metrics":["step_ms"],"rank":"all","xAxis":"step","minMax":true}`},
		{"series_user_metric", `{"queryType":"series","runId":"bert-z2","metrics":["metrics.tokens_seen"],"fromStep":5,"toStep":8}`},
		{"heatmap_forward", `{"queryType":"heatmap","runId":"bert-z2","pass":"forward","maxSteps":5}`},
		{"heatmap_backward_time", `{"queryType":"heatmap","runId":"bert-z2","pass":"backward","xAxis":"time","maxSteps":4}`},
		{"evals", `{"queryType":"evals","runId":"bert-z2"}`},
		{"breakdown", `{"queryType":"breakdown","runId":"bert-z2"}`},
		{"memory", `{"queryType":"memory","runId":"bert-z2"}`},
		{"compare", `{"queryType":"compare","runIds":["bert-z2","bert-z3"],"baseline":"bert-z2"}`},
		{"compare_sweep", `{"queryType":"compare","sweep":"zero-sweep"}`},
		{"ranks", `{"queryType":"ranks","runId":"bert-z2","stragglerPct":5}`},
		{"gpus", `{"queryType":"gpus","host":"node-a","metrics":["util_pct"]}`},
		{"gpus_one", `{"queryType":"gpus","host":"node-a","gpu":"1","metrics":["util_pct","power_w"]}`},
		{"series_with_step", `{"queryType":"series","runId":"bert-z2","metrics":["loss"],"withStep":true}`},
		{"run_summary_numeric", `{"queryType":"run_summary","runId":"bert-z2","format":"numeric"}`},
		{"ranks_numeric", `{"queryType":"ranks","runId":"bert-z2","stragglerPct":5,"format":"numeric"}`},
		{"gpus_table", `{"queryType":"gpus","host":"node-a","metrics":["util_pct","mem_used_bytes","mem_total_bytes","temp_c","power_w"],"format":"table"}`},
		{"annotations", `{"queryType":"annotations","runId":"bert-z2"}`},
		{"annotations_checkpoints", `{"queryType":"annotations","runId":"bert-z2","eventTypes":["checkpoint"]}`},
		{"annotations_evals", `{"queryType":"annotations","runId":"bert-z2","eventTypes":["eval"]}`},
	}
	req := &backend.QueryDataRequest{PluginContext: pc}
	for _, c := range cases {
		req.Queries = append(req.Queries, backend.DataQuery{
			RefID: c.name, QueryType: "", JSON: json.RawMessage(c.query), MaxDataPoints: 1000, Interval: time.Second,
			TimeRange: backend.TimeRange{From: t0.Add(-time.Hour), To: t0.Add(time.Hour)},
		})
	}
	resp, err := tp.Client.QueryData(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Responses) != len(cases) {
		t.Fatalf("%d responses for %d queries", len(resp.Responses), len(cases))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dr := resp.Responses[c.name]
			if dr.Error != nil {
				t.Fatalf("query failed: %v", dr.Error)
			}
			blankReceiptTimes(dr.Frames)
			experimental.CheckGoldenJSONResponse(t, "testdata", c.name+".golden", &dr, *update)
		})
	}

	// Heatmap frames label their columns with steps, on either x.
	for _, name := range []string{"heatmap_forward", "heatmap_backward_time"} {
		f := resp.Responses[name].Frames[0]
		// Meta travels as JSON: the steps arrive as numbers.
		var steps []float64
		raw, _ := json.Marshal(f.Meta.Custom.(map[string]any)["steps"])
		_ = json.Unmarshal(raw, &steps)
		if len(steps) == 0 || len(steps) != f.Rows() {
			t.Errorf("%s: steps %v for %d columns", name, steps, f.Rows())
		}
		for i := 1; i < len(steps); i++ {
			if steps[i] <= steps[i-1] {
				t.Errorf("%s: steps not ascending: %v", name, steps)
			}
		}
	}
	if x := resp.Responses["heatmap_backward_time"].Frames[0].Fields[0]; x.Type() != data.FieldTypeTime {
		t.Errorf("heatmap on time: x is %s", x.Type())
	}
	// Training charts on time carry the step, hidden but in the tooltip,
	// with no axis of its own.
	// The fixture's NaN loss at step 7 gets a mark of its own, at the
	// loss before it, and nothing elsewhere.
	ws := resp.Responses["series_with_step"].Frames[0]
	if len(ws.Fields) != 4 || ws.Fields[1].Name != "step" || ws.Fields[1].Config.Custom["hideFrom"] == nil ||
		ws.Fields[1].Config.Custom["axisPlacement"] != "hidden" {
		t.Errorf("series with step: %s", frameSummary(ws))
	}
	if m := ws.Fields[3]; m.Config.DisplayNameFromDS != "loss"+api.NonFiniteSuffix {
		t.Errorf("non-finite marks: %s", frameSummary(ws))
	} else {
		for i := range m.Len() {
			v, marked := m.ConcreteAt(i)
			step, _ := ws.Fields[1].ConcreteAt(i)
			if (step == int64(7)) != marked || (marked && v.(float64) != 2.0-6*0.05) {
				t.Errorf("row %d (step %v): mark %v, want the loss of step 6 at step 7 only", i, step, v)
			}
		}
	}
	// Alert rules read numbers with labels: one numeric-wide frame, no
	// string or time field.
	for _, name := range []string{"run_summary_numeric", "ranks_numeric"} {
		fr := resp.Responses[name].Frames
		if len(fr) != 1 || fr[0].Meta.Type != data.FrameTypeNumericWide || fr[0].Rows() != 1 {
			t.Fatalf("%s: %d frames %s", name, len(fr), frameSummary(fr[0]))
		}
		for _, fl := range fr[0].Fields {
			if !fl.Type().Numeric() || fl.Labels["run_id"] != "bert-z2" {
				t.Errorf("%s: field %s %s labels %v", name, fl.Name, fl.Type(), fl.Labels)
			}
		}
	}
	// One row per GPU, bytes in decimal units.
	gt := resp.Responses["gpus_table"].Frames[0]
	if gt.Rows() == 0 {
		t.Fatal("gpus table: no rows")
	}
	seen := map[string]bool{}
	for i := 0; i < gt.Rows(); i++ {
		k := fmt.Sprint(gt.Fields[0].At(i), gt.Fields[1].At(i))
		if seen[k] {
			t.Errorf("gpus table: GPU %s twice", k)
		}
		seen[k] = true
	}
	for _, fl := range gt.Fields {
		if fl.Name == "mem_used_bytes" && fl.Config.Unit != "decbytes" {
			t.Errorf("gpus table: memory unit %q", fl.Config.Unit)
		}
	}

	// What a user sees, beside the golden files: the NaN loss of the
	// overflowed step arrives as NaN, heatmap rows are typed for the
	// Heatmap panel, units are set.
	loss := resp.Responses["series_time"].Frames[0]
	if loss.Fields[1].Name != "loss" || loss.Meta.Type != data.FrameTypeTimeSeriesMulti {
		t.Fatalf("loss frame: %s", frameSummary(loss))
	}
	sawNaN := false
	for i := 0; i < loss.Rows(); i++ {
		if v, _ := loss.Fields[1].ConcreteAt(i); math.IsNaN(v.(float64)) {
			sawNaN = true
		}
	}
	if !sawNaN {
		t.Errorf("the NaN loss of step 7 did not come through")
	}
	if ms := resp.Responses["series_time"].Frames[1].Fields[1].Config.Unit; ms != "ms" {
		t.Errorf("step_ms unit %q, want ms", ms)
	}
	hm := resp.Responses["heatmap_forward"].Frames[0]
	if hm.Meta.Type != FrameTypeHeatmapRows || hm.Fields[0].Name != "step" || hm.Fields[1].Name != "embeddings" || hm.Fields[3].Name != "pooler" {
		t.Errorf("heatmap frame: %s", frameSummary(hm))
	}
	ann := resp.Responses["annotations"].Frames[0]
	if ann.Rows() == 0 || ann.Fields[0].Name != "time" {
		t.Errorf("annotations frame: %s", frameSummary(ann))
	}
	// Annotations of one event type carry only that type: the dashboard's
	// checkpoint and evaluation annotations do not repeat each other.
	for ref, want := range map[string]struct {
		typ  string
		rows int
	}{"annotations_checkpoints": {"checkpoint", 1}, "annotations_evals": {"eval", 2}} {
		f := resp.Responses[ref].Frames[0]
		typ := f.Fields[fieldIndex(t, f, "type")]
		if f.Rows() != want.rows {
			t.Errorf("%s: %d rows, want %d", ref, f.Rows(), want.rows)
		}
		for i := 0; i < f.Rows(); i++ {
			if v, _ := typ.ConcreteAt(i); v != want.typ {
				t.Errorf("%s: row %d has type %v", ref, i, v)
			}
		}
	}
}

func fieldIndex(t *testing.T, f *data.Frame, name string) int {
	t.Helper()
	for i, fl := range f.Fields {
		if fl.Name == name {
			return i
		}
	}
	t.Fatalf("frame %s has no field %q", frameSummary(f), name)
	return -1
}

// blankReceiptTimes clears last_seen_at, which the server stamps when it
// receives a record rather than from the record's own time.
func blankReceiptTimes(frames data.Frames) {
	for _, f := range frames {
		for _, fl := range f.Fields {
			if fl.Name == "last_seen_at" {
				for i := 0; i < fl.Len(); i++ {
					fl.Set(i, (*time.Time)(nil))
				}
			}
		}
	}
}

func frameSummary(f *data.Frame) string {
	var names []string
	for _, fl := range f.Fields {
		names = append(names, fl.Name+":"+fl.Type().String())
	}
	return f.Name + " [" + strings.Join(names, ", ") + "]"
}

// TestQueryDataErrors checks that a bad query fails alone, with a 4xx
// that says what is wrong, while the other queries of the request run.
func TestQueryDataErrors(t *testing.T) {
	base := startServer(t)
	ingest(t, base, fixtureRecords())
	tp := startPlugin(t)
	req := &backend.QueryDataRequest{PluginContext: pluginContext("errors", base, readToken), Queries: []backend.DataQuery{
		{RefID: "good", JSON: json.RawMessage(`{"queryType":"runs"}`)},
		{RefID: "type", JSON: json.RawMessage(`{"queryType":"bogus"}`)},
		{RefID: "norun", JSON: json.RawMessage(`{"queryType":"series","metrics":["loss"]}`)},
		{RefID: "metric", JSON: json.RawMessage(`{"queryType":"series","runId":"bert-z2","metrics":["nope"]}`)},
		{RefID: "unknown_run", JSON: json.RawMessage(`{"queryType":"run_summary","runId":"no-such-run"}`)},
		{RefID: "server_400", JSON: json.RawMessage(`{"queryType":"gpus","metrics":["not_a_gpu_metric"]}`)},
	}}
	resp, err := tp.Client.QueryData(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Responses["good"]; r.Error != nil || len(r.Frames) != 1 || r.Frames[0].Rows() != 2 {
		t.Fatalf("good query: %v %v", r.Error, r.Frames)
	}
	for ref, want := range map[string]struct {
		status backend.Status
		msg    string
	}{
		"type":        {backend.StatusBadRequest, "queryType"},
		"norun":       {backend.StatusBadRequest, "runId"},
		"metric":      {backend.StatusBadRequest, `unknown metric "nope"`},
		"unknown_run": {backend.StatusNotFound, "not found"},
		"server_400":  {backend.StatusBadRequest, "metric"},
	} {
		r := resp.Responses[ref]
		if r.Error == nil || r.Status != want.status || !strings.Contains(r.Error.Error(), want.msg) {
			t.Errorf("%s: status %d error %v; want %d containing %q", ref, r.Status, r.Error, want.status, want.msg)
		}
	}
}
