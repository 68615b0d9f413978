package collector_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var n int
	if err := storetest.Pool(t, st).QueryRow(ctx, sql).Scan(&n); err != nil {
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
	// Acknowledged means in the spool: the 100 records are on disk now.
	if v := metric(c1, "deepseed_collector_queue_records"); v != "100" && v != "101" {
		t.Fatalf("%s records waiting after the hook's posts were acknowledged, want the 100 (and maybe one sample)", v)
	}
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
	if v := metric(c2, `deepseed_collector_records_dropped_total{reason="spool_full"}`); v != "0" {
		t.Errorf("records dropped: %s", v)
	}
}

// TestForwardDeadLetter: a batch the server refuses is split until the
// refused record stands alone: the records the server takes arrive, the
// refused one lands in the dead-letter file with the server's message, and
// the queue moves on. (The server here stands in for one whose checks the
// collector's own validation cannot make.)
func TestForwardDeadLetter(t *testing.T) {
	var mu sync.Mutex
	var accepted []string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer secret" {
			t.Errorf("Authorization %q", r.Header.Get("Authorization"))
		}
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			t.Errorf("body: %v", err)
			return
		}
		body, _ := io.ReadAll(zr)
		w.Header().Set("Content-Type", "application/json")
		if bytes.Contains(body, []byte(`"step":1,`)) {
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"error":"record 0 (step): field run_id: unknown project"}`))
			return
		}
		mu.Lock()
		for _, l := range strings.Split(strings.TrimSpace(string(body)), "\n") {
			accepted = append(accepted, l)
		}
		mu.Unlock()
		w.Write([]byte(`{"accepted":1}`))
	}))
	defer ts.Close()
	spoolDir := t.TempDir()
	c, stop := runCollector(t, collector.Config{
		Server: ts.URL, Token: "secret", HookListen: "127.0.0.1:0", SpoolDir: spoolDir, HostName: "h",
		ProcRoot: t.TempDir(), Interval: time.Hour, BatchMaxAge: 20 * time.Millisecond,
	})
	sendSteps(t, c, 0, 4)
	waitFor(t, "the dead-letter count", func() bool { return metric(c, "deepseed_collector_records_dead_lettered_total") == "1" })
	waitFor(t, "the spool to drain", func() bool { return metric(c, "deepseed_collector_spool_batches") == "0" })
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
	if entry.Status != 400 || !strings.Contains(entry.Message, "unknown project") || len(entry.Records) != 1 ||
		!strings.Contains(string(entry.Records[0]), `"step":1,`) {
		t.Errorf("dead-letter entry: %+v", entry)
	}
	mu.Lock()
	defer mu.Unlock()
	var steps []string
	for _, l := range accepted {
		if strings.Contains(l, `"kind":"step"`) {
			steps = append(steps, l)
		}
	}
	if len(steps) != 3 {
		t.Errorf("the server took %d step records, want steps 0, 2 and 3: %q", len(steps), steps)
	}
}

// A refused token says nothing about the records: however many times the
// server answers 401 (or 403), the batch is retried whole, never split into
// the dead-letter file, and arrives once the token is accepted.
func TestForwardRetriesRefusedToken(t *testing.T) {
	defer collector.SetMinBackoff(time.Millisecond)()
	var mu sync.Mutex
	refusals := 0
	var accepted int
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		// Twenty times the same answer, where the collector splits a
		// batch refused five times alike.
		if refusals < 20 {
			refusals++
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":"token not accepted"}`))
			return
		}
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			t.Errorf("body: %v", err)
			return
		}
		body, _ := io.ReadAll(zr)
		accepted += strings.Count(string(body), `"kind":"step"`)
		w.Write([]byte(`{"accepted":1}`))
	}))
	defer ts.Close()
	spoolDir := t.TempDir()
	c, stop := runCollector(t, collector.Config{
		Server: ts.URL, Token: "secret", HookListen: "127.0.0.1:0", SpoolDir: spoolDir, HostName: "h",
		ProcRoot: t.TempDir(), Interval: time.Hour, BatchMaxAge: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	})
	sendSteps(t, c, 0, 4)
	waitFor(t, "the spool to drain", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return accepted == 4 && metric(c, "deepseed_collector_spool_batches") == "0"
	})
	stop()
	if v := metric(c, "deepseed_collector_records_dead_lettered_total"); v != "0" {
		t.Errorf("%s records dead-lettered after token refusals, want 0", v)
	}
	if _, err := os.Stat(filepath.Join(spoolDir, "dead-letter.ndjson")); err == nil {
		t.Error("a dead-letter file was written for token refusals")
	}
}

// A record the real server refuses (here a run name a CHECK forbids,
// standing for any value the validators miss) is dead-lettered alone by a
// real collector: the rest of its batch, and everything after it, arrive.
func TestForwardPoisonedBatchLandsTheRest(t *testing.T) {
	st := storetest.NewStore(t)
	if _, err := storetest.Pool(t, st).Exec(context.Background(), `ALTER TABLE runs ADD CONSTRAINT no_poison CHECK (name IS DISTINCT FROM 'poison')`); err != nil {
		t.Fatal(err)
	}
	srv := newIngestServer(t, st)
	spoolDir := t.TempDir()
	c, stop := runCollector(t, collector.Config{
		Server: "http://" + srv.addr, Token: "t", HookListen: "127.0.0.1:0", SpoolDir: spoolDir, HostName: "h",
		ProcRoot: t.TempDir(), Interval: time.Hour, BatchMaxAge: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	})
	var b strings.Builder
	for i := 0; i < 40; i++ {
		if i == 17 {
			b.WriteString(`{"kind":"run","run_id":"fwd","name":"poison"}` + "\n")
		}
		fmt.Fprintf(&b, `{"kind":"step","run_id":"fwd","rank":0,"step":%d,"loss":1}`+"\n", i)
	}
	if code, body := post(t, c, "POST", "/api/v1/ingest", "", b.String()); code != 200 {
		t.Fatalf("hook: %d %s", code, body)
	}
	sendSteps(t, c, 40, 60)
	waitFor(t, "the 60 steps in the database", func() bool { return count(t, st, `SELECT count(*) FROM steps WHERE run_id = 'fwd'`) == 60 })
	waitFor(t, "the spool to drain", func() bool { return metric(c, "deepseed_collector_spool_batches") == "0" })
	stop()
	if v := metric(c, "deepseed_collector_records_dead_lettered_total"); v != "1" {
		t.Fatalf("%s records dead-lettered, want the poisoned one", v)
	}
	f, err := os.ReadFile(filepath.Join(spoolDir, "dead-letter.ndjson"))
	if err != nil || !strings.Contains(string(f), `"name":"poison"`) || !strings.Contains(string(f), "no_poison") || strings.Count(string(f), "\n") != 1 {
		t.Fatalf("dead-letter file (%v):\n%s", err, f)
	}
}

// TestForwardStepsRecord: a steps record (many steps of one rank in
// columns, as the hook sends them) is taken, spooled as it came and
// stored by the server as its steps.
func TestForwardStepsRecord(t *testing.T) {
	st := storetest.NewStore(t)
	srv := newIngestServer(t, st)
	c, stop := runCollector(t, collector.Config{
		Server: "http://" + srv.addr, Token: "t", HookListen: "127.0.0.1:0", SpoolDir: t.TempDir(),
		HostName: "steps-node", ProcRoot: t.TempDir(), NVML: nvml.NewFake(mustCapture(t), 1), Interval: time.Hour,
		BatchMaxRecords: 25, BatchMaxAge: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	})
	defer stop()
	body := `{"kind":"steps","run_id":"cols","rank":2,"step":[10,11,12,13],"step_ms":[1,2,3,4],"lr":0.5}` + "\n" +
		`{"kind":"step","run_id":"cols","rank":2,"step":14,"step_ms":5}` + "\n"
	if code, resp := post(t, c, "POST", "/api/v1/ingest", "", body); code != 200 {
		t.Fatalf("hook: %d %s", code, resp)
	}
	if code, resp := post(t, c, "POST", "/api/v1/ingest", "", `{"kind":"steps","run_id":"cols","rank":2,"step":[1,2],"step_ms":[1]}`); code != 400 || !strings.Contains(resp, "step_ms") {
		t.Fatalf("a steps record with a short column: %d %s, want 400 naming step_ms", code, resp)
	}
	sum := func() int {
		return count(t, st, `SELECT coalesce(sum(step_ms * 10 + step), 0)::int FROM steps WHERE run_id = 'cols' AND rank = 2 AND lr IS NOT DISTINCT FROM
			CASE WHEN step < 14 THEN 0.5 END`)
	}
	// steps 10..14 with step_ms 1..5: 150 + 60.
	waitFor(t, "the five steps in the database", func() bool { return sum() == 210 })
	if n := count(t, st, `SELECT count(*) FROM steps WHERE run_id = 'cols'`); n != 5 {
		t.Fatalf("%d rows, want 5", n)
	}
}
