package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store/storetest"
)

// BenchmarkRefresh1024Ranks times the refresh of a cold run of 1,024
// ranks × 500 steps (5,120 rank-blocks), written off the clock, and
// reports rank-blocks refreshed a second: against ingest's steps a second
// (a live run of 1,024 ranks at 10 steps/s marks about 102 rank-blocks a
// second), the rate the refresher must keep.
//
//	go test -run '^$' -bench Refresh1024Ranks -benchtime 1x ./store/
func BenchmarkRefresh1024Ranks(b *testing.B) {
	const ranks, steps = 1024, 500
	ctx := context.Background()
	s := storetest.NewStore(b)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var blocks, took float64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		id := "bench-" + time.Now().Format("150405.000000")
		recs := []api.Record{{Run: &api.Run{Kind: "run", RunID: id, Project: "p", StartedAt: api.T(t0)}}}
		for st := int64(0); st < steps; st++ {
			for r := 0; r < ranks; r++ {
				recs = append(recs, api.Record{Step: &api.Step{Kind: "step", RunID: id, Rank: r, Step: api.Ptr(st),
					Time: api.T(t0.Add(time.Duration(st) * time.Second)), Loss: api.F(1 + 1/float64(st+1)),
					StepMS: api.F(100 + float64(r%7)), SyncNS: api.Ptr(st*1e8 + int64(r%5)*1e6), SyncWaitMS: api.F(float64(5 - r%5))}})
			}
			if len(recs) >= 20000 || st == steps-1 {
				if _, err := s.WriteBatch(ctx, recs); err != nil {
					b.Fatal(err)
				}
				recs = recs[:0]
			}
		}
		if _, err := s.AnalyzeStale(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		n, err := s.RefreshRollups(ctx, id)
		if err != nil {
			b.Fatal(err)
		}
		took += time.Since(start).Seconds()
		blocks += float64(n)
	}
	b.ReportMetric(blocks/took, "rank-blocks/s")
}
