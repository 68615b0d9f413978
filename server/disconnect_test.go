package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/store/storetest"
)

// A sender that goes away while its batch waits for the database is not
// the server's failure: it is logged below ERROR and not counted as a
// 500, and nothing of its batch is stored.
func TestClientDisconnectIsNotAnError(t *testing.T) {
	dbURL := storetest.NewDatabase(t)
	st := storetest.Open(t, dbURL, nil)
	var buf bytes.Buffer
	lw := &lockedWriter{w: &buf}
	logs := func() string { lw.mu.Lock(); defer lw.mu.Unlock(); return buf.String() }
	log := slog.New(slog.NewTextHandler(lw, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := testConfig()
	cfg.AlertsEvery = -1
	r := start(t, New(cfg, st, log))
	waitFor(t, "ready", func() bool { code, _, _ := do(t, "GET", r.url+"/readyz", "", ""); return code == 200 })

	// Hold the steps table, so that the batch waits for it.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE steps IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	reqCtx, cancel := context.WithCancel(ctx)
	req, _ := http.NewRequestWithContext(reqCtx, http.MethodPost, r.url+"/api/v1/ingest",
		strings.NewReader(`{"kind":"step","run_id":"gone","rank":0,"step":1,"time":1700000000,"loss":1}`))
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("answered %d while the table was held", resp.StatusCode)
		}
		done <- err
	}()
	// Leave once the server's write waits on the lock.
	waitFor(t, "the write waiting on the lock", func() bool {
		var n int
		_ = storetest.Pool(t, st).QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n)
		return n > 0
	})
	cancel()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("client: %v", err)
	}
	waitFor(t, "the request logged", func() bool {
		return strings.Contains(logs(), `msg="http request"`) && strings.Contains(logs(), "/api/v1/ingest")
	})
	tx.Rollback(ctx)

	out := logs()
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "level=ERROR") || strings.Contains(line, "status=500") {
			t.Errorf("a client that went away was logged as a failure: %s", line)
		}
		if strings.Contains(line, "path=/api/v1/ingest") && !strings.Contains(line, "status=499") {
			t.Errorf("the abandoned request was not recorded as 499: %s", line)
		}
	}
	var n int
	if err := storetest.Pool(t, st).QueryRow(ctx, `SELECT count(*) FROM steps WHERE run_id = 'gone'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("steps of the abandoned batch: %d (%v), want 0", n, err)
	}
}
