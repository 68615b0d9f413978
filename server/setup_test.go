package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/store/storetest"
)

// While the server has yet to set its database up (migrations, then
// TimescaleDB's hypertables, whose conversion would leave a write that
// waited for it in the table no query reads), a write is not acknowledged:
// it waits, then is answered 503 with Retry-After, and /readyz says why;
// once the setup is done the same write is stored.
func TestWritesWaitForTheDatabaseSetup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := storetest.NewDatabase(t)
	st := openStore(t, url)
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// The setup's migrations wait for a lock on the table they read.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE schema_migrations IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	srv := start(t, New(tokenConfig(RoleAll), st, testLogger(t)))
	body := `{"kind":"run","run_id":"setup-run"}` + "\n" + stepsBody("setup-run", 0, 10)
	code, msg, hdr := do(t, "POST", srv.url+"/api/v1/ingest", ingestToken, body)
	if code != 503 || hdr.Get("Retry-After") == "" || !strings.Contains(string(msg), "setup in progress") {
		t.Fatalf("a write before the setup: %d %s (Retry-After %q), want 503 saying the setup is in progress, with Retry-After",
			code, msg, hdr.Get("Retry-After"))
	}
	if n := countSteps(t, url, "setup-run"); n != 0 {
		t.Fatalf("%d steps stored by a write answered 503", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the server ready", func() bool { code, _, _ := do(t, "GET", srv.url+"/readyz", "", ""); return code == 200 })
	if code, msg, _ := do(t, "POST", srv.url+"/api/v1/ingest", ingestToken, body); code != 200 {
		t.Fatalf("the write once the setup is done: %d %s, want 200", code, msg)
	}
	if n := countSteps(t, url, "setup-run"); n != 10 {
		t.Fatalf("%d steps stored, want 10", n)
	}
}

func countSteps(t *testing.T, url, run string) int {
	t.Helper()
	var n int
	if err := storetest.Pool(t, url).QueryRow(context.Background(), `SELECT count(*) FROM steps WHERE run_id = $1`, run).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
