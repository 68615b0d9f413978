package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/store"
)

// stoppableServer is a real server on a fixed loopback port that can be
// stopped (connections refused) and started again on the same port.
type stoppableServer struct {
	t    *testing.T
	cfg  server.Config
	st   *store.Store
	addr string
	stop func()
}

func (s *stoppableServer) start() {
	s.t.Helper()
	l, err := net.Listen("tcp", s.addr)
	if err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- server.New(s.cfg, s.st, nil).Serve(ctx, l) }()
	s.stop = func() { cancel(); <-done }
	if err := waitReady(context.Background(), "http://"+s.addr+"/readyz", 200); err != nil {
		s.t.Fatal(err)
	}
}

func collectorMetrics(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	m, err := scrapeCollector(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A collector whose small spool fills while the server is stopped makes
// room by dropping its own samples, then answers the hook 503 with
// Retry-After; it never deletes a hook batch it acknowledged. Once the
// server is back, every acknowledged record arrives, once.
func TestCollectFullSpoolDropsSamplesNotAcknowledged(t *testing.T) {
	_, st := durableServer(t)
	cfg := server.DefaultConfig()
	cfg.IngestTokens = []string{"collect-token"}
	srv := &stoppableServer{t: t, cfg: cfg, st: st, addr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	srv.start()
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	// Host samples every 10 ms, cut into batches every 20 ms: the spool
	// holds sampled batches when the hook's records arrive.
	c := startCollect(t, "http://"+srv.addr, t.TempDir(), freePort(t), "--spool-max-bytes", "16384",
		"--interval", "10ms", "--batch-max-age", "20ms", "--metrics-listen", metrics)
	srv.stop()
	deadline := time.Now().Add(time.Minute)
	for collectorMetrics(t, metrics)[`deepseed_collector_spool_records{source="sampled"}`] < 5 {
		if time.Now().After(deadline) {
			t.Fatal("no sampled batches in the spool while the server is stopped")
		}
		time.Sleep(20 * time.Millisecond)
	}

	acked, deferred := 0, 0
	for s := 0; s < 5000 && deferred < 5; s += 10 {
		code, retry, err := c.post("evict", 0, s, s+10)
		if err != nil {
			t.Fatal(err)
		}
		switch code {
		case http.StatusOK:
			acked += 10
		case http.StatusServiceUnavailable:
			if retry == "" {
				t.Fatal("503 without Retry-After")
			}
			deferred++
			s -= 10 // sent again, as the hook does
			time.Sleep(20 * time.Millisecond)
		default:
			t.Fatalf("status %d", code)
		}
	}
	m := collectorMetrics(t, metrics)
	if deferred == 0 || acked == 0 {
		t.Fatalf("%d acknowledged, %d deferred: want both", acked, deferred)
	}
	if m[`deepseed_collector_records_dropped_total{reason="spool_full"}`] == 0 {
		t.Errorf("no sampled record was dropped to make room for the hook's")
	}
	if got := m[`deepseed_collector_spool_records{source="hook"}`]; got != float64(acked) {
		t.Errorf("spool holds %v hook records, want the %d acknowledged", got, acked)
	}
	if m["deepseed_collector_hook_requests_deferred_total"] < float64(deferred) {
		t.Errorf("deferred requests counted %v, want at least %d", m["deepseed_collector_hook_requests_deferred_total"], deferred)
	}
	if m["deepseed_collector_forward_lag_seconds"] <= 0 {
		t.Errorf("forward lag %v while acknowledged records wait, want above 0", m["deepseed_collector_forward_lag_seconds"])
	}

	srv.start()
	defer srv.stop()
	waitSteps(t, st, "evict", acked)
	got, twice := stepsOf(t, st, "evict")
	if len(got) != acked || twice != 0 {
		t.Fatalf("%d steps stored (%d twice), want exactly the %d acknowledged", len(got), twice, acked)
	}
	for s := 0; s < acked; s++ {
		if !got[s] {
			t.Fatalf("acknowledged step %d lost", s)
		}
	}
}
