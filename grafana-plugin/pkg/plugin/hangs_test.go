package plugin

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
	"github.com/grafana/grafana-plugin-sdk-go/data"
)

// A run whose rank 1 stopped at step 7 while rank 0 waits inside the
// all-reduce of step 8: the hang_reports table gives each rank's report,
// the rank that stopped first on top, with its last collective, its main
// thread's stack and its host's GPU snapshot; a run without a report gets
// a notice saying why the table is empty.
func TestHangReportsTable(t *testing.T) {
	base := startServer(t)
	report := func(rank int, step int, completed bool, stack string) string {
		b, _ := json.Marshal(map[string]any{"reason": "stalled", "rank": rank, "host": "node-a", "step": step,
			"stalled_s": 312.4, "last_collective": map[string]any{"name": "all_reduce", "seq": 40 + step, "completed": completed},
			"threads": []map[string]any{{"name": "MainThread", "stack": stack}, {"name": "loader", "stack": "queue.get"}}})
		return string(b)
	}
	gpus, _ := json.Marshal(map[string]any{"host": "node-a", "gpus": []map[string]any{
		{"gpu": 0, "util_pct": 100}, {"gpu": 1, "util_pct": 0, "xid_total": 2}}})
	recs := []map[string]any{
		{"kind": "run", "run_id": "hung", "project": "p", "started_at": ts(0)},
		{"kind": "run", "run_id": "healthy", "project": "p", "started_at": ts(0)},
		{"kind": "event", "run_id": "hung", "time": ts(400 * time.Second), "step": 8, "rank": 0, "type": "hang",
			"text": report(0, 8, false, "train.py:42 loss.backward()\ndist.all_reduce")},
		{"kind": "event", "run_id": "hung", "time": ts(401 * time.Second), "step": 7, "rank": 1, "type": "hang",
			"text": report(1, 7, true, "train.py:30 next(loader)")},
		{"kind": "event", "run_id": "hung", "time": ts(402 * time.Second), "step": 7, "rank": 1, "type": "hang_gpus",
			"text": string(gpus)},
	}
	ingest(t, base, recs)
	tp := startPlugin(t)
	req := &backend.QueryDataRequest{PluginContext: pluginContext("hangs", base, readToken)}
	for _, run := range []string{"hung", "healthy"} {
		req.Queries = append(req.Queries, backend.DataQuery{RefID: run,
			JSON:      json.RawMessage(`{"queryType":"hang_reports","runId":"` + run + `"}`),
			TimeRange: backend.TimeRange{From: time.Now().Add(-time.Hour), To: time.Now()}})
	}
	resp, err := tp.Client.QueryData(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	hung := resp.Responses["hung"]
	if hung.Error != nil || len(hung.Frames) != 1 {
		t.Fatalf("hung: %v, %d frames", hung.Error, len(hung.Frames))
	}
	f := hung.Frames[0]
	if n, _ := f.RowLen(); n != 2 {
		t.Fatalf("%d rows, want one per rank", n)
	}
	col := func(name string, row int) string {
		field, _ := f.FieldByName(name)
		if field == nil {
			t.Fatalf("no field %q", name)
		}
		switch v := field.At(row).(type) {
		case *int64:
			return strconv.FormatInt(*v, 10)
		case string:
			return v
		}
		return ""
	}
	if col("rank", 0) != "1" || col("step", 0) != "7" || col("rank", 1) != "0" {
		t.Errorf("rows ranks %s, %s: want rank 1 (stopped first, step 7) on top", col("rank", 0), col("rank", 1))
	}
	if got := col("last_collective", 1); got != "all_reduce #48, waiting inside it" {
		t.Errorf("rank 0 last collective %q", got)
	}
	if got := col("stack", 0); got != "train.py:30 next(loader)" {
		t.Errorf("rank 1 stack %q", got)
	}
	if got := col("gpus", 0); got != "GPU 0 100 %; GPU 1 0 %, 2 XID" {
		t.Errorf("rank 1 GPUs %q", got)
	}
	if got := col("reason", 0); !strings.Contains(got, "stalled") || !strings.Contains(got, "312 s") {
		t.Errorf("reason %q", got)
	}

	healthy := resp.Responses["healthy"]
	if healthy.Error != nil || len(healthy.Frames) != 1 {
		t.Fatalf("healthy: %v", healthy.Error)
	}
	// No columns either: Grafana shows the panel's no-hang sentence, not
	// a table of headers.
	if hf := healthy.Frames[0]; len(hf.Fields) != 0 || !hasNotice(hf, "no hang reported") {
		t.Errorf("healthy run: %d fields, notices %v; want none and a reason", len(hf.Fields), hf.Meta)
	}

	// On the time charts the reports read as sentences: the server's
	// summary of who stopped first for a hang, a line per GPU for the
	// snapshot; never the report's JSON.
	areq := &backend.QueryDataRequest{PluginContext: req.PluginContext, Queries: []backend.DataQuery{{RefID: "A",
		JSON:      json.RawMessage(`{"queryType":"annotations","runId":"hung","eventTypes":["hang","hang_gpus"]}`),
		TimeRange: backend.TimeRange{From: time.Now().Add(-time.Hour), To: time.Now()}}}}
	aresp, err := tp.Client.QueryData(context.Background(), areq)
	if err != nil || aresp.Responses["A"].Error != nil {
		t.Fatalf("annotations: %v %v", err, aresp.Responses["A"].Error)
	}
	af := aresp.Responses["A"].Frames[0]
	texts, _ := af.FieldByName("text")
	if texts == nil || texts.Len() != 3 {
		t.Fatalf("annotation texts %v, want three", texts)
	}
	for i := range texts.Len() {
		text := texts.At(i).(string)
		if strings.HasPrefix(text, "{") {
			t.Errorf("annotation %d shows JSON: %s", i, text)
		}
	}
	if got := texts.At(1).(string); !strings.HasPrefix(got, "rank 1 stopped first: rank 0 on step 8, waiting in all_reduce") ||
		!strings.Contains(got, "Hang reports table") {
		t.Errorf("rank 1's hang annotation says %q", got)
	}
	if got := texts.At(2).(string); got != "GPUs of node-a at the hang: GPU 0 100 %; GPU 1 0 %, 2 XID" {
		t.Errorf("GPU snapshot annotation says %q", got)
	}
}

func hasNotice(f *data.Frame, prefix string) bool {
	if f.Meta == nil {
		return false
	}
	for _, n := range f.Meta.Notices {
		if strings.HasPrefix(n.Text, prefix) {
			return true
		}
	}
	return false
}
