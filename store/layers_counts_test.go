package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// TestLayerCountsKeptOnlyWhereALayerWentUntimed: a layer rollup keeps its
// per-layer counts only where some row left a layer untimed; elsewhere
// they are stored NULL (migration 0022), and every reader still gets one
// count per layer, the bucket's rows.
func TestLayerCountsKeptOnlyWhereALayerWentUntimed(t *testing.T) {
	s := storetest.NewStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mustExec(t, s, `INSERT INTO runs (run_id, layer_names) VALUES ('c', '{a,b,c}')`)
	// Every 10th step of 0–2999 on ranks 0 and 1 times every layer, but
	// rank 1's step 1230 has no time for layer b forward, and no backward.
	mustExec(t, s, `INSERT INTO layer_times (run_id, rank, step, time, forward_ms, backward_ms)
		SELECT 'c', r, s, '2026-01-01'::timestamptz + s * interval '1 second',
		       CASE WHEN r = 1 AND s = 1230 THEN ARRAY[1, NULL, 3]::float8[] ELSE ARRAY[1, 2, 3]::float8[] END,
		       CASE WHEN r = 1 AND s = 1230 THEN NULL ELSE ARRAY[4, 5, 6]::float8[] END
		FROM generate_series(0, 2999, 10) s, (VALUES (0), (1)) ranks(r)`)
	mustExec(t, s, `INSERT INTO rollup_dirty (run_id, rank, block) SELECT DISTINCT run_id, rank, step / 100 FROM layer_times`)
	if _, err := s.RefreshRollups(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	// Stored counts: only rank 1's buckets holding step 1230.
	stored := query(t, s, `SELECT rank, width, bucket, fwd_counts IS NOT NULL, bwd_counts IS NOT NULL FROM layer_rollups
		WHERE run_id = 'c' AND (fwd_counts IS NOT NULL OR bwd_counts IS NOT NULL) ORDER BY 1, 2, 3`)
	want := [][]any{
		{int32(1), int32(100), int64(12), true, true},
		{int32(1), int32(1000), int64(1), true, true},
		{int32(1), int32(10000), int64(0), true, true},
	}
	compareRows(t, "buckets that keep their counts", stored, want)

	for _, w := range store.RollupWidths {
		for rank := 0; rank <= 1; rank++ {
			for _, backward := range []bool{false, true} {
				rows, err := s.LayerRollups(ctx, "c", rank, w, 0, 1000, backward)
				if err != nil {
					t.Fatal(err)
				}
				if len(rows) != int((3000+w-1)/w) {
					t.Fatalf("rank %d width %d: %d buckets", rank, w, len(rows))
				}
				for _, r := range rows {
					n := min(w/10, 300) // rows of the bucket
					want := []int64{n, n, n}
					if rank == 1 && r.Bucket == 1230/w {
						if backward {
							want = []int64{n - 1, n - 1, n - 1}
						} else {
							want = []int64{n, n - 1, n}
						}
					}
					if len(r.Counts) != 3 || r.Counts[0] != want[0] || r.Counts[1] != want[1] || r.Counts[2] != want[2] {
						t.Errorf("rank %d width %d bucket %d backward %v: counts %v, want %v", rank, w, r.Bucket, backward, r.Counts, want)
					}
				}
			}
		}
	}
	means, err := s.LayerMeans(ctx, "c", 1, 0, []string{"a", "b", "c"})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]float64{"a forward": 1, "b forward": 2, "c forward": 3, "a backward": 4, "c backward": 6} {
		if means[k] != v {
			t.Errorf("layer mean %s = %v, want %v (all: %v)", k, means[k], v, means)
		}
	}
}
