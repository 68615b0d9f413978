package store_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/deepseed/deepseed/internal/fleettest"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// plainStore opens a store on a fresh database of the test server, migrated
// and left on plain PostgreSQL even where the server has TimescaleDB: the
// twin that timings on TimescaleDB compare with.
func plainStore(tb testing.TB) *store.Store {
	tb.Helper()
	ctx := context.Background()
	admin := storetest.AdminURL(tb)
	name := fmt.Sprintf("deepseed_plain_%d", time.Now().UnixNano())
	adminDB := storetest.Pool(tb, admin)
	if _, err := adminDB.Exec(ctx, `CREATE DATABASE `+name); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_, _ = adminDB.Exec(context.Background(), `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`)
	})
	s := storetest.Open(tb, storetest.WithDatabase(admin, name), nil)
	if _, err := s.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	return s
}

// BenchmarkResumeCompressed times a run resumed from a checkpoint: the
// last 100 steps of 16 ranks (steps and layers) sent again, an hour later
// and with other values, on TimescaleDB with every chunk compressed and
// on plain PostgreSQL, A B A B on the same server: in one batch (as a
// collector forwards its node's ranks) and in one batch per rank. It
// reports the median time of one resume in each mode and their ratio;
// ns/op is the pair's. Each resume starts from the same state: the run is
// written and compressed again before it, off the clock.
//
//	DEEPSEED_TEST_TIMESCALE=require go test -run '^$' -bench ResumeCompressed -benchtime 10x ./store/
func BenchmarkResumeCompressed(b *testing.B) {
	needTimescale(b)
	b.Run("one-batch", func(b *testing.B) { benchResume(b, true) })
	b.Run("batch-per-rank", func(b *testing.B) { benchResume(b, false) })
}

func benchResume(b *testing.B, oneBatch bool) {
	ctx := context.Background()
	const ranks, steps, resumed = 16, 1200, 100
	start := time.Now().Add(-30 * 24 * time.Hour).Truncate(24 * time.Hour)
	type mode struct {
		name  string
		store *store.Store
		times []time.Duration
	}
	modes := []*mode{{name: "timescaledb", store: storetest.NewStore(b)}, {name: "postgresql", store: plainStore(b)}}
	for round := range b.N {
		for _, m := range modes {
			b.StopTimer()
			s := m.store
			if _, err := storetest.Pool(b, s).Exec(ctx, `TRUNCATE runs, steps, layer_times, evals, rollup_dirty`); err != nil {
				b.Fatal(err)
			}
			g := fleettest.GenRun{ID: "resumed", Ranks: ranks, Steps: steps, Start: start, Every: 3 * time.Minute,
				Seed: uint64(round) + 1, Layers: 8}
			for rank := range ranks {
				writeLines(b, s, 5000, g.StepLines(rank, 0, steps, 0))
			}
			if m.name == "timescaledb" {
				compressAll(b, s)
			}
			var batches [][]string
			for rank := range ranks {
				lines := g.StepLines(rank, steps-resumed, steps, time.Hour)
				if oneBatch && rank > 0 {
					batches[0] = append(batches[0], lines...)
					continue
				}
				batches = append(batches, lines)
			}
			b.StartTimer()
			t0 := time.Now()
			for i, batch := range batches {
				res, err := s.WriteBatch(ctx, mustDecodeTB(b, batch...))
				if err != nil {
					b.Fatalf("%s: resume batch %d: %v", m.name, i, err)
				}
				if res.Accepted != len(batch) {
					b.Fatalf("%s: resume batch %d took %d records, want %d", m.name, i, res.Accepted, len(batch))
				}
			}
			m.times = append(m.times, time.Since(t0))
		}
	}
	b.StopTimer()
	median := func(d []time.Duration) float64 {
		d = slices.Clone(d)
		slices.Sort(d)
		n := len(d)
		return float64(d[(n-1)/2]+d[n/2]) / 2 / float64(time.Millisecond)
	}
	ts, pg := median(modes[0].times), median(modes[1].times)
	b.ReportMetric(ts, "timescaledb-ms")
	b.ReportMetric(pg, "postgresql-ms")
	b.ReportMetric(ts/pg, "ratio")
}
