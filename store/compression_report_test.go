package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/internal/fleettest"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// TestCompressionReport loads realistic data (the demo's runs, the seed
// dashboard's export and a generated 20,000-step run with 8 GPUs sampled at
// 1 Hz, all with the noise of real runs and the precision the hook and
// collector send), compresses every chunk, and reports what TimescaleDB's
// hypertable_compression_stats says. A report, not a check: run it with
// DEEPSEED_COMPRESSION_REPORT=1 on a machine with TimescaleDB.
func TestCompressionReport(t *testing.T) {
	if os.Getenv("DEEPSEED_COMPRESSION_REPORT") == "" {
		t.Skip("a report: set DEEPSEED_COMPRESSION_REPORT=1 to run it")
	}
	if !storetest.Mode(t).Timescale {
		t.Skip("needs TimescaleDB")
	}
	s := storetest.NewStore(t)
	anchor := time.Now().Add(-40 * 24 * time.Hour)
	loadRealistic(t, s, anchor)
	compressAll(t, s)
	t.Log("\n" + compressionStats(t, s))
	if os.Getenv("DEEPSEED_COMPRESSION_COLUMNS") != "" {
		for _, h := range []string{"steps", "layer_times", "gpu_samples"} {
			t.Log("\n" + columnBytes(t, s, h))
		}
	}
}

// columnBytes reports the compressed bytes per row of each column of
// hypertable h, summed over its compressed chunks.
func columnBytes(t *testing.T, s *store.Store, h string) string {
	t.Helper()
	ctx := context.Background()
	var chunks []string
	rows, err := storetest.Pool(t, s).Query(ctx, `SELECT format('%I.%I', cc.schema_name, cc.table_name)
		FROM _timescaledb_catalog.chunk c JOIN _timescaledb_catalog.chunk cc ON cc.id = c.compressed_chunk_id
		JOIN _timescaledb_catalog.hypertable ht ON ht.id = c.hypertable_id WHERE ht.table_name = $1`, h)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, n)
	}
	rows.Close()
	var total int64
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT count(*) FROM `+h).Scan(&total); err != nil {
		t.Fatal(err)
	}
	cols, err := storetest.Pool(t, s).Query(ctx, `SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, chunks[0])
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for cols.Next() {
		var n string
		if err := cols.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	cols.Close()
	var b strings.Builder
	fmt.Fprintf(&b, "%s, compressed bytes per row by column:\n", h)
	for _, col := range names {
		var sum int64
		for _, c := range chunks {
			var n *int64
			if err := storetest.Pool(t, s).QueryRow(ctx, fmt.Sprintf(`SELECT sum(pg_column_size(%q)) FROM %s`, col, c)).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != nil {
				sum += *n
			}
		}
		fmt.Fprintf(&b, "  %-22s %6.2f\n", col, float64(sum)/float64(total))
	}
	return b.String()
}

// loadRealistic writes the demo, the seed export and a generated run.
func loadRealistic(t *testing.T, s *store.Store, anchor time.Time) {
	t.Helper()
	ctx := context.Background()
	for _, r := range fleettest.DemoRuns(anchor) {
		var lines []string
		for _, rec := range r.Records() {
			b, err := json.Marshal(rec)
			if err != nil {
				t.Fatal(err)
			}
			lines = append(lines, string(b))
		}
		writeLines(t, s, 4000, lines)
		if _, err := s.RefreshRollups(ctx, r.ID); err != nil {
			t.Fatal(err)
		}
	}
	body, err := os.ReadFile("../ingest/testdata/training_metrics.json")
	if err != nil {
		t.Fatal(err)
	}
	recs, err := ingest.ParseExport(body, ingest.ImportOptions{RunID: "seed", Start: anchor.Add(-48 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteBatch(ctx, recs); err != nil {
		t.Fatal(err)
	}
	// DEEPSEED_GEN_PERIOD=10 generates what the hook sends by default in a
	// single process (norm, layers and phases every 10th step); unset, all
	// of them on every step, as the figures of decision 0009 were taken.
	period, _ := strconv.Atoi(os.Getenv("DEEPSEED_GEN_PERIOD"))
	g := fleettest.GenRun{ID: "gen", Ranks: 1, Steps: 20000, Start: anchor.Add(-30 * time.Hour), Every: 5400 * time.Millisecond,
		Seed: 11, Layers: 24, EvalEvery: 20, Period: period}
	writeLines(t, s, 4000, g.StepLines(0, 0, g.Steps, 0))
	writeLines(t, s, 4000, g.EvalLines())
	writeLines(t, s, 8000, g.GPULines("gen-node", 8))
	for _, id := range []string{"seed", "gen"} {
		if _, err := s.RefreshRollups(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// compressionStats reports rows, bytes per row before and after, and the
// ratio of every hypertable, and the sizes of the rollup tables.
func compressionStats(t *testing.T, s *store.Store) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	fmt.Fprintf(&b, "%-14s %10s %12s %12s %8s\n", "table", "rows", "B/row before", "B/row after", "ratio")
	for _, h := range []string{"steps", "layer_times", "evals", "events", "gpu_samples", "host_samples"} {
		var rows int64
		if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT count(*) FROM `+h).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		var before, after *int64
		if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT before_compression_total_bytes, after_compression_total_bytes
			FROM hypertable_compression_stats($1::regclass)`, h).Scan(&before, &after); err != nil {
			t.Fatal(err)
		}
		if rows == 0 || before == nil || after == nil {
			fmt.Fprintf(&b, "%-14s %10d %12s %12s %8s\n", h, rows, "-", "-", "-")
			continue
		}
		fmt.Fprintf(&b, "%-14s %10d %12.0f %12.0f %7.1fx\n", h, rows, float64(*before)/float64(rows), float64(*after)/float64(rows), float64(*before)/float64(*after))
	}
	for _, r := range []string{"metric_rollup_rows", "metric_rollup_sets", "layer_rollups", "runs"} {
		var rows, bytes int64
		if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT (SELECT count(*) FROM `+r+`), pg_total_relation_size($1::regclass)`, r).Scan(&rows, &bytes); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%-14s %10d rows, %d kB\n", r, rows, bytes/1024)
	}
	return b.String()
}
