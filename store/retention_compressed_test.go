package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// gpuSpan inserts 1 Hz samples of GPUs 0 to gpus-1 of host, attributed to
// run (none when ""), for the seconds [from, to) after start: what a
// collector writes, with SQL, so that a million rows take seconds.
func gpuSpan(t testing.TB, s *store.Store, run, host string, gpus int, start time.Time, from, to int) {
	t.Helper()
	if _, err := storetest.Pool(t, s).Exec(context.Background(), `INSERT INTO gpu_samples (time, host, gpu, run_id, util_pct, power_w)
		SELECT $1::timestamptz + s * interval '1 second', $2, g, $3, 90 + (s % 7), 300 + (s % 13)
		FROM generate_series($4::int, $5::int - 1) s, generate_series(0, $6::int - 1) g`,
		start, host, run, from, to, gpus); err != nil {
		t.Fatalf("insert GPU samples of %s/%s: %v", host, run, err)
	}
}

// compressGPUSamples compresses every chunk of gpu_samples and returns how
// many samples of run sit in compressed chunks.
func compressGPUSamples(t testing.TB, s *store.Store, run string) int {
	t.Helper()
	if _, err := storetest.Pool(t, s).Exec(context.Background(), `SELECT compress_chunk(c) FROM show_chunks('gpu_samples') c`); err != nil {
		t.Fatalf("compress gpu_samples: %v", err)
	}
	// Right after compression every row is in a compressed batch: the
	// chunks themselves hold none.
	if n := mustCount(t, s, `SELECT count(*) FROM timescaledb_information.chunks
		WHERE hypertable_name = 'gpu_samples' AND NOT is_compressed`); n != 0 {
		t.Fatalf("setup: %d gpu_samples chunks not compressed", n)
	}
	return mustCount(t, s, `SELECT count(*) FROM gpu_samples WHERE run_id = $1`, run)
}

// An expired run with more GPU samples in compressed chunks than
// TimescaleDB decompresses in one transaction by default (100,000) is
// dropped whole: from the segments it has alone (host node-b), rows
// written since compression included, and from those it shares with a
// run that stays (host node-a). The run that stays
// and the samples of no run newer than the horizon keep every row.
func TestApplyRetentionDropsLargeCompressedRun(t *testing.T) {
	needTimescale(t)
	ctx := context.Background()
	s := storetest.NewStore(t)
	day := time.Now().Add(-200 * 24 * time.Hour).Truncate(24 * time.Hour) // one chunk
	if _, err := storetest.Pool(t, s).Exec(ctx, `INSERT INTO runs (run_id, updated_at)
		VALUES ('big', now() - interval '100 days'), ('kept', now())`); err != nil {
		t.Fatal(err)
	}
	gpuSpan(t, s, "big", "node-a", 8, day, 0, 15000)      // 120,000, beside kept's
	gpuSpan(t, s, "kept", "node-a", 8, day, 15000, 20000) // 40,000
	gpuSpan(t, s, "big", "node-b", 8, day, 0, 15000)      // 120,000, alone
	gpuSpan(t, s, "", "node-c", 2, day, 0, 1000)          // 2,000 of no run
	recent := time.Now().Add(-time.Hour)
	gpuSpan(t, s, "", "node-c", 2, recent, 0, 10) // 20 of no run, recent
	if n := compressGPUSamples(t, s, "big"); n != 240000 {
		t.Fatalf("setup: run big has %d samples, want 240,000", n)
	}
	// Written since compression: in the chunk itself, beside the batches.
	gpuSpan(t, s, "big", "node-b", 8, day, 15000, 15100)

	res, err := s.ApplyRetention(ctx, 90*24*time.Hour)
	if err != nil || res.Failures != 0 {
		t.Fatalf("ApplyRetention = %+v, %v; want no failure", res, err)
	}
	if res.Runs != 1 || res.GPUSamples != 2000 {
		t.Errorf("ApplyRetention = %+v; want run big and 2,000 samples of no run dropped", res)
	}
	for _, c := range []struct {
		sql  string
		want int
	}{
		{`SELECT count(*) FROM gpu_samples WHERE run_id = 'big'`, 0},
		{`SELECT count(*) FROM runs WHERE run_id = 'big'`, 0},
		{`SELECT count(*) FROM gpu_samples WHERE run_id = 'kept'`, 40000},
		{`SELECT count(*) FROM gpu_samples WHERE run_id = 'kept' AND host = 'node-a'`, 40000},
		{`SELECT count(*) FROM gpu_samples WHERE run_id = ''`, 20},
	} {
		if n := mustCount(t, s, c.sql); n != c.want {
			t.Errorf("%s = %d, want %d", c.sql, n, c.want)
		}
	}
}

// The samples of no run in compressed chunks go by their own time, also
// in segments shared with a run that stays and for a run id that has no
// runs row, however many there are.
func TestApplyRetentionDropsCompressedSamplesOfNoRun(t *testing.T) {
	needTimescale(t)
	ctx := context.Background()
	s := storetest.NewStore(t)
	day := time.Now().Add(-200 * 24 * time.Hour).Truncate(24 * time.Hour)
	if _, err := storetest.Pool(t, s).Exec(ctx, `INSERT INTO runs (run_id, updated_at) VALUES ('kept', now())`); err != nil {
		t.Fatal(err)
	}
	gpuSpan(t, s, "", "node-a", 8, day, 0, 15000)             // 120,000 of no run
	gpuSpan(t, s, "kept", "node-a", 8, day, 15000, 20000)     // 40,000, same segments
	gpuSpan(t, s, "", "node-b", 8, day, 0, 15000)             // 120,000 of no run, alone
	gpuSpan(t, s, "never-announced", "node-c", 1, day, 0, 50) // a run id with no run
	gpuSpan(t, s, "never-announced", "node-a", 1, day, 20000, 20050)
	compressGPUSamples(t, s, "")

	res, err := s.ApplyRetention(ctx, 90*24*time.Hour)
	if err != nil || res.Failures != 0 {
		t.Fatalf("ApplyRetention = %+v, %v; want no failure", res, err)
	}
	if res.GPUSamples != 240100 {
		t.Errorf("ApplyRetention dropped %d GPU samples, want 240,100", res.GPUSamples)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM gpu_samples`); n != 40000 {
		t.Errorf("%d GPU samples left, want kept's 40,000", n)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM gpu_samples WHERE run_id = 'kept'`); n != 40000 {
		t.Errorf("run kept has %d samples, want 40,000", n)
	}
}

// The samples of a run alone on its host those days go as whole
// compressed batches: nothing is decompressed into the chunk, whose own
// table does not grow.
func TestApplyRetentionDropsOwnedSegmentsWithoutDecompressing(t *testing.T) {
	needTimescale(t)
	ctx := context.Background()
	s := storetest.NewStore(t)
	day := time.Now().Add(-200 * 24 * time.Hour).Truncate(24 * time.Hour)
	if _, err := storetest.Pool(t, s).Exec(ctx, `INSERT INTO runs (run_id, updated_at)
		VALUES ('big', now() - interval '100 days'), ('kept', now())`); err != nil {
		t.Fatal(err)
	}
	gpuSpan(t, s, "big", "node-a", 8, day, 0, 15000)
	gpuSpan(t, s, "kept", "node-b", 8, day, 0, 15000)
	compressGPUSamples(t, s, "big")
	size := func() int {
		t.Helper()
		return mustCount(t, s, `SELECT sum(pg_relation_size(format('%I.%I', chunk_schema, chunk_name)))::int
			FROM timescaledb_information.chunks WHERE hypertable_name = 'gpu_samples'`)
	}
	before := size()
	res, err := s.ApplyRetention(ctx, 90*24*time.Hour)
	if err != nil || res.Failures != 0 || res.Runs != 1 {
		t.Fatalf("ApplyRetention = %+v, %v; want run big dropped", res, err)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM gpu_samples WHERE run_id = 'big'`); n != 0 {
		t.Fatalf("run big keeps %d samples", n)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM gpu_samples WHERE run_id = 'kept'`); n != 120000 {
		t.Fatalf("run kept has %d samples, want 120,000", n)
	}
	if after := size(); after != before {
		t.Errorf("the chunk's own table went from %d to %d bytes: samples were decompressed into it", before, after)
	}
}

// BenchmarkRetentionCompressedGPU times what dropping a million GPU
// samples from compressed chunks costs, two chunks of 8 GPUs beside
// another host's million that stay: the retention pass against the
// delete it replaced, run with TimescaleDB's decompression limit lifted
// (with the limit, the default, that delete fails). Layouts: "run-alone",
// an expired run on a host no other run used those days; "run-shared",
// the same run on a host whose GPUs served a run that stays the same days
// (every segment shared); "no-run", samples of no run; "nothing", a pass
// that finds nothing to drop (two million samples of runs that stay).
// docs/retention.md has the figures.
//
//	DEEPSEED_TEST_TIMESCALE=require go test -run '^$' -bench RetentionCompressedGPU -benchtime 3x ./store/
func BenchmarkRetentionCompressedGPU(b *testing.B) {
	needTimescale(b)
	const span = 125000 // seconds: a million samples of 8 GPUs
	for _, layout := range []string{"run-alone", "run-shared", "no-run", "nothing"} {
		for _, method := range []string{"pass", "lifted-limit"} {
			if layout == "nothing" && method != "pass" {
				continue
			}
			b.Run(layout+"/"+method, func(b *testing.B) {
				ctx := context.Background()
				s := storetest.NewStore(b)
				day := time.Now().Add(-200 * 24 * time.Hour).Truncate(24 * time.Hour)
				from := day.Add(12 * time.Hour) // two chunks, both shared in run-shared
				for range b.N {
					b.StopTimer()
					if _, err := storetest.Pool(b, s).Exec(ctx, `TRUNCATE gpu_samples, runs`); err != nil {
						b.Fatal(err)
					}
					if _, err := storetest.Pool(b, s).Exec(ctx, `INSERT INTO runs (run_id, updated_at)
						VALUES ('big', now() - interval '100 days'), ('kept', now())`); err != nil {
						b.Fatal(err)
					}
					run := "big"
					switch layout {
					case "no-run":
						run = ""
					case "nothing":
						run = "kept"
					}
					gpuSpan(b, s, run, "node-a", 8, from, 0, span)
					gpuSpan(b, s, "kept", "node-b", 8, from, 0, span)
					if layout == "run-shared" {
						gpuSpan(b, s, "kept", "node-a", 8, day, 0, 12*3600)
						gpuSpan(b, s, "kept", "node-a", 8, from, span, 36*3600)
					}
					want, left := 8*span, 0 // samples of run, before and after
					if layout == "nothing" {
						want, left = 16*span, 16*span
					}
					if n := compressGPUSamples(b, s, run); n != want {
						b.Fatalf("setup: %d samples of run %q, want %d", n, run, want)
					}
					b.StartTimer()
					switch method {
					case "pass":
						res, err := s.ApplyRetention(ctx, 90*24*time.Hour)
						if err != nil || res.Failures != 0 {
							b.Fatalf("ApplyRetention = %+v, %v", res, err)
						}
					case "lifted-limit":
						del := `DELETE FROM gpu_samples WHERE run_id = 'big'`
						if layout == "no-run" {
							del = `DELETE FROM gpu_samples g WHERE time < now() - interval '90 days'
								AND (run_id = '' OR NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = g.run_id))`
						}
						tx, err := storetest.Pool(b, s).Begin(ctx)
						if err != nil {
							b.Fatal(err)
						}
						if _, err := tx.Exec(ctx, `SET LOCAL timescaledb.max_tuples_decompressed_per_dml_transaction = 0`); err != nil {
							b.Fatal(err)
						}
						if _, err := tx.Exec(ctx, del); err != nil {
							b.Fatal(err)
						}
						if err := tx.Commit(ctx); err != nil {
							b.Fatal(err)
						}
					}
					b.StopTimer()
					if n := mustCount(b, s, `SELECT count(*) FROM gpu_samples WHERE run_id = $1`, run); n != left {
						b.Fatalf("%d samples of run %q left, want %d", n, run, left)
					}
					if n := mustCount(b, s, `SELECT count(*) FROM gpu_samples WHERE host = 'node-b'`); n != 8*span {
						b.Fatalf("%d samples of the run that stays on node-b, want %d", n, 8*span)
					}
					b.StartTimer()
				}
			})
		}
	}
}
