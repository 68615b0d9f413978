package query_test

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/query"
	"github.com/deepseed/deepseed/store/storetest"
)

// TestRunRefresherWithConcurrentReadersAndWriters runs the background
// refresher while ingest appends steps and readers refresh and read the
// same run, then checks that every step is counted exactly once and the
// last spike is in the series, and that the refresher stops with its
// context.
func TestRunRefresherWithConcurrentReadersAndWriters(t *testing.T) {
	e := newEnv(t)
	names := []string{"l0", "l1", "l2"}
	// block writes whole 100-step blocks, so a write never re-marks a
	// block whose refresh may be in flight.
	block := func(b int64) []api.Record {
		var recs []api.Record
		for i := b * 100; i < (b+1)*100; i++ {
			loss := 1 + float64(i%10)
			recs = append(recs, stepRec("bg", 0, i, func(s *api.Step) { s.Loss = api.F(loss) }))
			f := []api.Float{1, api.Float(i % 3), 2}
			recs = append(recs, api.Record{Layers: &api.Layers{Kind: "layers", RunID: "bg", Step: api.Ptr(i),
				Time: api.T(t0.Add(time.Duration(i) * time.Second)), Names: names, ForwardMS: f}})
		}
		return recs
	}
	recs := []api.Record{runRec("bg", nil)}
	for b := int64(0); b < 60; b++ {
		recs = append(recs, block(b)...)
	}
	e.write(recs...)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		query.RunRefresher(ctx, e.s, 5*time.Millisecond, nil)
	}()

	const blocks = 121
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // ingest keeps appending
		defer wg.Done()
		for b := int64(60); b < blocks-1; b++ {
			if _, err := e.s.WriteBatch(context.Background(), block(b)); err != nil {
				t.Errorf("write block %d: %v", b, err)
				return
			}
		}
	}()
	for r := 0; r < 2; r++ { // readers refresh as they read
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				if _, err := e.s.RefreshRollups(context.Background(), "bg"); err != nil {
					t.Errorf("reader refresh: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// The refresher alone catches up with the last write.
	e.write(block(blocks - 1)...)
	deadline := time.Now().Add(time.Minute)
	for {
		runs, err := e.s.DirtyRuns(context.Background(), 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(runs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("refresher left markers: %+v", runs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done

	// Stop readers from refreshing: with no markers left, these reads see
	// what the refresher built.
	var res api.SeriesResponse
	e.get("/runs/bg/series?metric=loss&max_points=12", 200, &res)
	var total int64
	var sum float64
	for _, p := range res.Series[0].Points {
		total += p.Count
		sum += float64(p.Value) * float64(p.Count)
	}
	if total != blocks*100 || math.Abs(sum-blocks*100*5.5) > 1e-6 {
		t.Errorf("series covers %d rows summing to %v, want %d rows summing to %v", total, sum, blocks*100, blocks*100*5.5)
	}
	var hm api.Heatmap
	e.get("/runs/bg/heatmap?max_steps=12", 200, &hm)
	if len(hm.Steps) == 0 || hm.BucketSteps < 1000 {
		t.Fatalf("heatmap read %d columns of %d steps, want whole rollup buckets", len(hm.Steps), hm.BucketSteps)
	}
	for j, first := range hm.Steps {
		n := min(hm.BucketSteps, blocks*100-first)
		var mid float64
		for s := first; s < first+n; s++ {
			mid += float64(s % 3)
		}
		for l, want := range []float64{1, mid / float64(n), 2} {
			if got := hm.Values[l][j]; got == nil || !near(float64(*got), want) {
				t.Errorf("heatmap [%s][step %d] = %v, want %v", names[l], first, got, want)
			}
		}
	}
	var n int
	if err := storetest.Pool(t, e.s).QueryRow(context.Background(), `
		SELECT count(*) FROM metric_rollups WHERE run_id = 'bg' AND metric = 'step' AND width = 100`).Scan(&n); err != nil || n != blocks {
		t.Errorf("width-100 step buckets: %d (%v), want %d", n, err, blocks)
	}
}
