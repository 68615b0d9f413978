package main

import (
	"context"
	"regexp"
	"strconv"
	"testing"

	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/server/servertest"
	"github.com/deepseed/deepseed/store/storetest"
)

// TestBenchIngest runs the load tool for two short rounds against a real
// server and its database: it reports each phase and a ratio per round and
// overall, and deletes its scratch runs afterwards.
func TestBenchIngest(t *testing.T) {
	dbURL := storetest.NewDatabase(t)
	st := storetest.Open(t, dbURL, nil)
	cfg := server.DefaultConfig()
	cfg.IngestTokens = []string{"bench-token"}
	base := servertest.Start(t, cfg, st)

	code, stdout, stderr := runBinary(t, []string{"DEEPSEED_TOKEN=bench-token"}, "bench", "ingest", "--server", base,
		"--database-url", dbURL, "--connections", "2", "--rounds", "2", "--duration", "1s",
		"--ranks", "2", "--layers", "3", "--steps-per-batch", "5", "--max-records", "400")
	if code != 0 {
		t.Fatalf("bench ingest exited %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	rate := func(re string) float64 {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(stdout)
		if m == nil {
			t.Fatalf("no line matching %q in:\n%s", re, stdout)
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil || v <= 0 {
			t.Fatalf("%q: got %q, want a positive figure", re, m[1])
		}
		return v
	}
	for _, r := range []string{"1", "2"} {
		rate(`round ` + r + `  http ingest: \d+ records in [\d.]+s = (\d+) records/s`)
		rate(`round ` + r + `  raw COPY: +\d+ records in [\d.]+s = (\d+) records/s`)
		rate(`round ` + r + `  ratio: +(\d+) % of raw COPY`)
	}
	httpRate := rate(`(?m)^http ingest: (\d+) records/s \(median of 2 rounds\)`)
	rawRate := rate(`(?m)^raw COPY: +(\d+) records/s \(median of 2 rounds\)`)
	if ratio := rate(`(?m)^ratio: +(\d+) % of raw COPY \(median`); ratio > 1000 || httpRate/rawRate > 10 {
		t.Errorf("implausible figures: http %.0f, raw %.0f, ratio %.0f %%", httpRate, rawRate, ratio)
	}

	var left int
	if err := storetest.Pool(t, st).QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM runs WHERE run_id LIKE 'bench-%') + (SELECT count(*) FROM steps WHERE run_id LIKE 'bench-%')`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d scratch runs and steps left behind, want none", left)
	}
}

// TestBenchIngestPerRank plays 20 ranks of one run, each its own sender,
// against a real server: what was accepted is stored once (the tool exits
// non-zero otherwise), the figures are printed, and the run is deleted
// afterwards.
func TestBenchIngestPerRank(t *testing.T) {
	dbURL := storetest.NewDatabase(t)
	st := storetest.Open(t, dbURL, nil)
	cfg := server.DefaultConfig()
	cfg.IngestTokens = []string{"bench-token"}
	base := servertest.Start(t, cfg, st)

	code, stdout, stderr := runBinary(t, []string{"DEEPSEED_TOKEN=bench-token"}, "bench", "ingest", "--per-rank", "--server", base,
		"--database-url", dbURL, "--ranks", "20", "--rate", "5", "--duration", "3s")
	if code != 0 {
		t.Fatalf("bench ingest --per-rank exited %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, re := range []string{
		`(?m)^offered: +300 records`,
		`(?m)^accepted: +\d+ records = \d+ records/s, 0 duplicates`,
		`(?m)^latency: +p50 \S+, p99 \S+, max \S+ over \d+ requests`,
		`(?m)^stored: +\d+ steps, 0 stored twice`,
	} {
		if !regexp.MustCompile(re).MatchString(stdout) {
			t.Errorf("no line matching %q in:\n%s", re, stdout)
		}
	}
	var left int
	if err := storetest.Pool(t, st).QueryRow(context.Background(), `SELECT count(*) FROM steps WHERE run_id LIKE 'bench-ranks-%'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d steps of the scratch run left behind", left)
	}
}

// TestBenchCollector runs the collector bench for a moment with a few
// ranks: its own PostgreSQL, server and collector start, every record it
// acknowledged is stored once, and it prints what it measured.
func TestBenchCollector(t *testing.T) {
	code, stdout, stderr := runBinary(t, nil, "bench", "collector", "--ranks", "4", "--rate", "20", "--duration", "2s")
	if code != 0 {
		t.Fatalf("bench collector exited %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	m := regexp.MustCompile(`(?m)^database: +(\d+) records stored for (\d+) acknowledged, (\d+) stored twice`).FindStringSubmatch(stdout)
	if m == nil {
		t.Fatalf("no database line in:\n%s", stdout)
	}
	if m[1] != m[2] || m[3] != "0" || m[2] == "0" {
		t.Errorf("bench collector: %s stored for %s acknowledged, %s twice; want every acknowledged record once", m[1], m[2], m[3])
	}
	for _, re := range []string{`(?m)^acknowledged: \d+ records`, `(?m)^forwarded: `, `(?m)^ack latency: +p50 `} {
		if !regexp.MustCompile(re).MatchString(stdout) {
			t.Errorf("no line matching %q in:\n%s", re, stdout)
		}
	}
}
