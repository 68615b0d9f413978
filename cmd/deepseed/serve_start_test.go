package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store/storetest"
)

// A database URL naming a database that does not exist is an error that
// waiting cannot fix: serve and migrate say so and exit 1, promptly,
// instead of retrying forever.
func TestMissingDatabaseIsAClearError(t *testing.T) {
	url := storetest.WithDatabase(storetest.AdminURL(t), "deepseed_no_such_db")
	start := time.Now()
	_, exited, logs := startServe(t, []string{"DEEPSEED_DATABASE_URL=" + url}, "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	select {
	case <-exited.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("serve against a missing database still runs after 60s:\n%s", logs)
	}
	out := logs.String()
	if exited.err == nil || !strings.Contains(out, `database "deepseed_no_such_db" does not exist`) || !strings.Contains(out, "create it") {
		t.Fatalf("serve against a missing database: %v after %v, output:\n%s\nwant exit 1 naming the database and what to do", exited.err, time.Since(start), out)
	}
	last := lastLine(out)
	if !strings.HasPrefix(last, "deepseed: database: ") || strings.Contains(out, "retrying") {
		t.Errorf("serve against a missing database: want one last line starting \"deepseed: database: \" and no retries, got:\n%s", out)
	}

	code, _, stderr := runBinary(t, nil, "migrate", "--database-url", url)
	if code != 1 || !strings.HasPrefix(lastLine(stderr), "deepseed: migrate: database: ") || !strings.Contains(stderr, "does not exist") {
		t.Errorf("migrate against a missing database: exit %d, stderr:\n%s", code, stderr)
	}
}

// While the database server is merely unreachable, serve waits for it:
// up, /readyz 503, logged at WARN and INFO, not as errors; a component is
// named once per line.
func TestServeWaitsForUnreachableDatabase(t *testing.T) {
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/deepseed?sslmode=disable&connect_timeout=1", freePort(t))
	port := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	cmd, exited, logs := startServe(t, []string{"DEEPSEED_DATABASE_URL=" + url}, "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	waitHTTP(t, base+"/readyz", http.StatusServiceUnavailable, exited)
	res, err := http.Post(base+"/api/v1/ingest", "application/x-ndjson",
		strings.NewReader(`{"kind":"run","run_id":"wait-for-db","project":"p"}`+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("ingest with the database away: %d, want 503", res.StatusCode)
	}
	for deadline := time.Now().Add(2 * time.Minute); !strings.Contains(logs.String(), "database not reachable yet"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			break // reported below, with the output
		}
	}
	time.Sleep(2 * time.Second) // a few more retries, which must not each be logged
	stopServe(t, cmd, exited)
	out := logs.String()
	if !strings.Contains(out, "database not reachable yet") {
		t.Errorf("serve did not say it waits for the database:\n%s", out)
	}
	if strings.Count(out, "database not reachable yet") > 2 {
		t.Errorf("serve logged every retry:\n%s", out)
	}
	if !strings.Contains(out, "component=ingest") {
		t.Errorf("the ingest handler's warning is missing:\n%s", out)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "level=ERROR") {
			t.Errorf("logged as an error while the database is away: %s", l)
		}
		if strings.Count(l, "component=") > 1 {
			t.Errorf("component named twice: %s", l)
		}
	}
}
