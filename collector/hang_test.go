package collector_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/collector"
	"github.com/deepseed/deepseed/store/storetest"
)

// A rank's hang report gets the node's GPU readings beside it: an event
// on the same run, rank and step holding each GPU's newest sample, as the
// server stores it.
func TestHangReportGetsTheNodesGPUs(t *testing.T) {
	st := storetest.NewStore(t)
	srv := newIngestServer(t, st)
	c, stop := runCollector(t, collector.Config{
		Server: "http://" + srv.addr, Token: "t", HookListen: "127.0.0.1:0", SpoolDir: t.TempDir(),
		HostName: "hang-node", ProcRoot: "testdata/proc", NVML: twoGPUCapture(t), Interval: time.Hour,
		BatchMaxRecords: 25, BatchMaxAge: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	})
	defer stop()
	c.SampleOnce()
	body := `{"kind":"run","run_id":"hung","project":"p","name":"hung","started_at":1795660000}
{"kind":"event","run_id":"hung","rank":1,"step":20,"time":1795660100,"type":"hang","text":"{\"reason\":\"stalled\",\"step\":20}"}
{"kind":"event","run_id":"hung","rank":1,"step":19,"time":1795660090,"type":"checkpoint","text":"saved"}`
	if code, msg := post(t, c, "POST", "/api/v1/ingest", "", body); code != 200 {
		t.Fatalf("hook: %d %s", code, msg)
	}
	events := func() int {
		return count(t, st, `SELECT count(*) FROM events WHERE run_id = 'hung'`)
	}
	waitFor(t, "the events in the database", func() bool { return events() == 3 })
	for _, typ := range []string{"hang", "hang_gpus", "checkpoint"} {
		if n := count(t, st, `SELECT count(*) FROM events WHERE run_id = 'hung' AND type = '`+typ+`'`); n != 1 {
			t.Fatalf("%d events of type %s; want one of each of the hook's and one GPU snapshot", n, typ)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var rank int
	var step int64
	var text string
	if err := storetest.Pool(t, st).QueryRow(ctx, `SELECT rank, step, text FROM events WHERE run_id = 'hung' AND type = 'hang_gpus'`).
		Scan(&rank, &step, &text); err != nil {
		t.Fatal(err)
	}
	var snap struct {
		Host string    `json:"host"`
		GPUs []api.GPU `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(text), &snap); err != nil {
		t.Fatalf("snapshot %q: %v", text, err)
	}
	if rank != 1 || step != 20 || snap.Host != "hang-node" || len(snap.GPUs) != 2 {
		t.Fatalf("snapshot on rank %d step %d from %q with %d GPUs; want rank 1, step 20, hang-node, 2 GPUs",
			rank, step, snap.Host, len(snap.GPUs))
	}
	for i, g := range snap.GPUs {
		want := collector.LastGPURecord(c, i)
		if g.UUID != want.UUID || g.UtilPct == nil || want.UtilPct == nil || *g.UtilPct != *want.UtilPct ||
			g.PowerW == nil || g.SMClockMHz == nil {
			t.Errorf("GPU %d in the snapshot %+v; want the collector's last reading %+v", i, g, want)
		}
	}
}
