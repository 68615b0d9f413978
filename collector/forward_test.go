package collector_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/collector"
	"github.com/deepseed/deepseed/collector/nvml"
	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// ingestServer is a real deepseed ingest endpoint over a test database
// that can be stopped and started again on the same address.
type ingestServer struct {
	t    testing.TB
	addr string
	h    http.Handler
	srv  *http.Server
}

func newIngestServer(t testing.TB, st *store.Store) *ingestServer {
	e := echo.New()
	e.HideBanner = true
	ingest.New(st, ingest.Options{}).Register(e.Group("/api/v1"))
	s := &ingestServer{t: t, h: e}
	s.start("127.0.0.1:0")
	t.Cleanup(s.stop)
	return s
}

func (s *ingestServer) start(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	s.srv = &http.Server{Handler: s.h}
	go s.srv.Serve(ln)
}

func (s *ingestServer) stop() {
	if s.srv != nil {
		s.srv.Close()
		s.srv = nil
	}
}

// runCollector starts a collector and returns a function that stops it
// gracefully and waits.
func runCollector(t *testing.T, cfg collector.Config) (*collector.Collector, func()) {
	t.Helper()
	c, err := collector.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return c, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("collector run: %v", err)
		}
	}
}

func sendSteps(t *testing.T, c http.Handler, from, to int) {
	t.Helper()
	for s := from; s < to; s += 10 {
		var b strings.Builder
		for i := s; i < s+10 && i < to; i++ {
			fmt.Fprintf(&b, `{"kind":"step","run_id":"fwd","rank":0,"step":%d,"loss":%g}`+"\n", i, 1/float64(i+1))
		}
		if code, body := post(t, c, "POST", "/api/v1/ingest", "", b.String()); code != 200 {
			t.Fatalf("hook: %d %s", code, body)
		}
	}
}

func count(t *testing.T, st *store.Store, sql string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := st.Pool.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitFor polls cond until it holds; the deadline only guards against a
// hang, it is not what the test measures.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func metric(c *collector.Collector, name string) string {
	var buf bytes.Buffer
	c.WriteMetrics(&buf)
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return v
		}
	}
	return ""
}

// TestForwardSurvivesOutageAndRestart: the server stops mid-stream and the
// collector restarts while it is down; once the server is back every
// record is in the database exactly once.
func TestForwardSurvivesOutageAndRestart(t *testing.T) {
	st := storetest.NewStore(t)
	srv := newIngestServer(t, st)
	spoolDir := t.TempDir()
	cfg := func() collector.Config {
		fake := nvml.NewFake(mustCapture(t), 1)
		return collector.Config{
			Server: "http://" + srv.addr, Token: "t", HookListen: "127.0.0.1:0", SpoolDir: spoolDir,
			HostName: "fwd-node", ProcRoot: t.TempDir(), NVML: fake, Interval: time.Hour,
			BatchMaxRecords: 25, BatchMaxAge: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		}
	}
	steps := func() int { return count(t, st, `SELECT count(*) FROM steps WHERE run_id = 'fwd'`) }

	c1, stop1 := runCollector(t, cfg())
	sendSteps(t, c1, 0, 100)
	waitFor(t, "the first 100 steps in the database", func() bool { return steps() == 100 })

	srv.stop()
	sendSteps(t, c1, 100, 200)
	waitFor(t, "the collector to spool while the server is down", func() bool {
		return metric(c1, "deepseed_collector_queue_records") == "0" && metric(c1, "deepseed_collector_spool_bytes") != "0"
	})
	stop1()

	c2, stop2 := runCollector(t, cfg())
	sendSteps(t, c2, 200, 300)
	srv.start(srv.addr)
	waitFor(t, "all 300 steps in the database", func() bool { return steps() >= 300 })
	waitFor(t, "the spool to drain", func() bool { return metric(c2, "deepseed_collector_spool_batches") == "0" })
	stop2()

	if n := steps(); n != 300 {
		t.Errorf("steps table holds %d rows, want 300", n)
	}
	if n := count(t, st, `SELECT count(DISTINCT step) FROM steps WHERE run_id = 'fwd' AND step BETWEEN 0 AND 299`); n != 300 {
		t.Errorf("%d distinct steps, want 300", n)
	}
	// One GPU sample from each collector's first tick.
	if n := count(t, st, `SELECT count(*) FROM gpu_samples WHERE host = 'fwd-node'`); n != 2 {
		t.Errorf("gpu_samples holds %d rows, want 2", n)
	}
	if v := metric(c2, "deepseed_collector_records_dropped_total"); v != "0" {
		t.Errorf("records dropped: %s", v)
	}
}

// TestForwardDeadLetter: a batch the server refuses with a 4xx is not
// retried: it lands in the dead-letter file with the server's message and
// is counted.
func TestForwardDeadLetter(t *testing.T) {
	hits := 0
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		if r.Header.Get("Authorization") != "Bearer secret" {
			t.Errorf("Authorization %q", r.Header.Get("Authorization"))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte(`{"error":"record 0 (step): field run_id: unknown project"}`))
	}))
	defer ts.Close()
	spoolDir := t.TempDir()
	c, stop := runCollector(t, collector.Config{
		Server: ts.URL, Token: "secret", HookListen: "127.0.0.1:0", SpoolDir: spoolDir, HostName: "h",
		ProcRoot: t.TempDir(), Interval: time.Hour, BatchMaxAge: 20 * time.Millisecond,
	})
	sendSteps(t, c, 0, 3)
	waitFor(t, "the dead-letter count", func() bool { return metric(c, "deepseed_collector_records_dead_lettered_total") == "3" })
	stop()

	f, err := os.ReadFile(filepath.Join(spoolDir, "dead-letter.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	var entry struct {
		Status  int               `json:"status"`
		Message string            `json:"message"`
		Records []json.RawMessage `json:"records"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(f), &entry); err != nil {
		t.Fatalf("dead-letter file: %v\n%s", err, f)
	}
	if entry.Status != 400 || !strings.Contains(entry.Message, "unknown project") || len(entry.Records) != 3 {
		t.Errorf("dead-letter entry: %+v", entry)
	}
	if hits != 1 {
		t.Errorf("server asked %d times, want once (no retries for a 4xx)", hits)
	}
	if v := metric(c, "deepseed_collector_spool_batches"); v != "0" {
		t.Errorf("spool holds %s batches after a dead letter", v)
	}
}
