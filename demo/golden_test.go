package demo_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deepseed/deepseed/demo"
)

var update = flag.Bool("update", false, "rewrite testdata/records.golden from what the demo posts")

// goldenPath holds, for a fixed anchor, each run's record count and the
// SHA-256 of the NDJSON the demo posts for it, and the hash of all of it.
const goldenPath = "testdata/records.golden"

// postedRecords loads the demo into a server that only listens, and
// returns the NDJSON it was sent, run by run in the order of the load.
func postedRecords(t *testing.T, anchor time.Time) (ids []string, bodies map[string]*bytes.Buffer) {
	t.Helper()
	var mu sync.Mutex
	bodies = map[string]*bytes.Buffer{}
	var current string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if id, ok := strings.CutPrefix(r.URL.Path, "/api/v1/runs/"); ok && r.Method == http.MethodGet {
			// The load asks for each run before it writes it: none is there yet.
			current = id
			ids = append(ids, id)
			bodies[id] = &bytes.Buffer{}
			http.NotFound(w, r)
			return
		}
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		b, err := io.ReadAll(zr)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		bodies[current].Write(b)
		fmt.Fprintf(w, `{"accepted":%d}`, bytes.Count(b, []byte("\n")))
	}))
	defer srv.Close()
	if _, err := demo.Load(context.Background(), demo.Options{Server: srv.URL, Anchor: anchor}); err != nil {
		t.Fatalf("load: %v", err)
	}
	return ids, bodies
}

// TestDemoRecordsAreGolden holds what deepseed demo posts to the bytes:
// every record of every run, for a fixed anchor, hashes as the golden
// file says. Regenerate it with -update only when the demo is meant to
// change.
func TestDemoRecordsAreGolden(t *testing.T) {
	anchor := time.Date(2026, 5, 4, 12, 30, 0, 0, time.UTC)
	ids, bodies := postedRecords(t, anchor)
	var got strings.Builder
	all := sha256.New()
	records := 0
	for _, id := range ids {
		b := bodies[id].Bytes()
		n := bytes.Count(b, []byte("\n"))
		records += n
		all.Write(b)
		fmt.Fprintf(&got, "%s %d %x\n", id, n, sha256.Sum256(b))
	}
	fmt.Fprintf(&got, "all %d %x\n", records, all.Sum(nil))
	if *update {
		if err := os.WriteFile(goldenPath, []byte(got.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(goldenPath)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	gotLines, wantLines := strings.Split(got.String(), "\n"), strings.Split(string(want), "\n")
	for i := range max(len(gotLines), len(wantLines)) {
		g, w := line(gotLines, i), line(wantLines, i)
		if g != w {
			t.Errorf("the demo's records changed (id, records, SHA-256 of the run's NDJSON):\n got %s\nwant %s", g, w)
		}
	}
}

// line is lines[i], or "(none)" past the end.
func line(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "(none)"
}
