package plugin

import (
	"context"
	"encoding/json"
	"github.com/deepseed/deepseed/api"
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
)

// A run some of whose steps have an MFU above 1 gets a row saying so in
// words, the sentence first; a run whose numbers hold gets no columns, so
// the panel shows "All numbers consistent", and a notice saying it.
func TestConsistencyTable(t *testing.T) {
	base := startServer(t)
	recs := []map[string]any{
		{"kind": "run", "run_id": "broken", "project": "p", "started_at": ts(0)},
		{"kind": "run", "run_id": "sound", "project": "p", "started_at": ts(0)},
	}
	for step := 1; step <= 20; step++ {
		mfu := 0.3
		if step%5 == 0 {
			mfu = 1.2155
		}
		for _, run := range []string{"broken", "sound"} {
			m := mfu
			if run == "sound" {
				m = 0.3
			}
			recs = append(recs, map[string]any{"kind": "step", "run_id": run, "rank": 0, "step": step,
				"time": ts(time.Duration(step) * time.Second), "step_ms": 30, "mfu": m, "tokens": 8192})
		}
	}
	ingest(t, base, recs)
	tp := startPlugin(t)
	req := &backend.QueryDataRequest{PluginContext: pluginContext("consistency", base, readToken)}
	for _, run := range []string{"broken", "sound"} {
		req.Queries = append(req.Queries, backend.DataQuery{RefID: run,
			JSON:      json.RawMessage(`{"queryType":"consistency","runId":"` + run + `"}`),
			TimeRange: backend.TimeRange{From: time.Now().Add(-time.Hour), To: time.Now()}})
	}
	resp, err := tp.Client.QueryData(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	broken := resp.Responses["broken"]
	if broken.Error != nil || len(broken.Frames) != 1 {
		t.Fatalf("broken: %v, %d frames", broken.Error, len(broken.Frames))
	}
	f := broken.Frames[0]
	if n, _ := f.RowLen(); n != 1 || f.Fields[0].Config.DisplayNameFromDS != "What it means" {
		t.Fatalf("broken run: %d rows, first column %v; want one row, its sentence first", n, f.Fields[0].Config)
	}
	check, _ := f.FieldByName("check")
	text := f.Fields[0].At(0).(string)
	if check.At(0) != "MFU within (0, 1]" || !strings.Contains(text, "outside (0, 1]") {
		t.Errorf("row: check %q, text %q", check.At(0), text)
	}
	sound := resp.Responses["sound"]
	if sound.Error != nil || len(sound.Frames) != 1 {
		t.Fatalf("sound: %v", sound.Error)
	}
	if sf := sound.Frames[0]; len(sf.Fields) != 0 || !hasNotice(sf, api.ConsistentText) {
		t.Errorf("sound run: %d fields, meta %v; want none and %q", len(sf.Fields), sf.Meta, api.ConsistentText)
	}
}
