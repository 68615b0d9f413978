// Package servertest runs a real DeepSeed server on loopback for tests of
// the packages that talk to it (the plugin, the dashboards).
package servertest

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/store"
)

// Start serves a server with cfg over st on a free 127.0.0.1 port until
// the test ends, and returns its base URL once /readyz answers 200.
func Start(t testing.TB, cfg server.Config, st *store.Store) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(cfg, st, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })
	base := "http://" + l.Addr().String()
	// Ready once migrated, which on a loaded machine takes a while.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		res, err := http.Get(base + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return base
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server at %s never became ready (%v)", base, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Ingest posts records to the server at base as NDJSON with token, in
// bodies of at most 10,000 records as a collector sends them, and fails
// the test on any answer but 200.
func Ingest(t testing.TB, base, token string, records []map[string]any) {
	t.Helper()
	for len(records) > 0 {
		n := min(len(records), 10000)
		var b strings.Builder
		for _, r := range records[:n] {
			line, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(line)
			b.WriteByte('\n')
		}
		records = records[n:]
		req, err := http.NewRequest(http.MethodPost, base+"/api/v1/ingest", strings.NewReader(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/x-ndjson")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("ingest: %d %s", res.StatusCode, body)
		}
	}
}

// WaitRollups waits, with a generous deadline, until the run's rollups
// have caught up with its raw rows (its summary carries no rollup_lag):
// reads no longer wait for the refresher, so a test that reads a large
// run's rolled-up views right after loading it waits here first.
func WaitRollups(t testing.TB, base, token, runID string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		req, err := http.NewRequest(http.MethodGet, base+"/api/v1/runs/"+runID, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		var lag struct {
			RollupLag *json.RawMessage `json:"rollup_lag"`
		}
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode == http.StatusOK && json.Unmarshal(body, &lag) == nil && lag.RollupLag == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rollups of run %s never caught up (last error %v)", runID, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
