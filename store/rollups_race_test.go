package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// A write into a block while its rollups are being refreshed neither waits
// for the refresh nor loses its refresh: its marker survives, and the next
// refresh counts its step.
func TestWriteDuringRefreshKeepsItsMarker(t *testing.T) {
	ctx := context.Background()
	s := storetest.NewStore(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	step := func(i int64) api.Record {
		return api.Record{Step: &api.Step{Kind: api.KindStep, RunID: "race", Step: api.Ptr(i),
			Time: api.T(t0.Add(time.Duration(i) * time.Second)), Loss: api.F(1), StepMS: api.F(100)}}
	}
	if _, err := s.WriteBatch(ctx, []api.Record{step(1), step(2)}); err != nil {
		t.Fatal(err)
	}

	var writeErr error
	wrote := false
	restore := store.SetAfterMarkersRead(func() {
		if wrote {
			return
		}
		wrote = true
		// The refresh holds its transaction open here. A write that had to
		// wait for it would never finish: give it a deadline.
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_, writeErr = s.WriteBatch(wctx, []api.Record{step(3)})
	})
	if _, err := s.RefreshRollups(ctx, "race"); err != nil {
		t.Fatal(err)
	}
	restore()
	if writeErr != nil {
		t.Fatalf("write during a refresh: %v", writeErr)
	}
	var markers int
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT count(*) FROM rollup_dirty WHERE run_id = 'race' AND block = 0`).Scan(&markers); err != nil {
		t.Fatal(err)
	}
	if markers != 1 {
		t.Fatalf("markers of block 0 after a refresh that raced a write: %d, want 1", markers)
	}
	if _, err := s.RefreshRollups(ctx, "race"); err != nil {
		t.Fatal(err)
	}
	var count int64
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT count FROM metric_rollups WHERE run_id = 'race' AND metric = 'loss' AND width = 100 AND bucket = 0`).Scan(&count); err != nil {
		t.Fatal(err)
	}
	if count != 3 {
		t.Fatalf("loss samples in bucket 0 after the second refresh: %d, want 3", count)
	}
}
