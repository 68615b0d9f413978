package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// TestSyncRollupsMatchTheirSQL holds the synchronisation rollups the
// refresh folds in Go to the SQL that defines them (the figures of GET
// /runs/{id}/ranks, clock offsets block by block), on four ranks with
// host clock offsets, steps without arrivals (lateness from waits),
// steps with neither, a NaN wait, missing step times, a rank missing
// from some steps and a step written twice, after a cold refresh and
// after an incremental one.
func TestSyncRollupsMatchTheirSQL(t *testing.T) {
	s := storetest.NewStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := storetest.Pool(t, s)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`INSERT INTO runs (run_id) VALUES ('r')`)
	exec(`INSERT INTO steps (run_id, rank, step, time, sync_ns, sync_wait_ms, step_ms)
		SELECT 'r', r, s, '2026-01-01'::timestamptz + s * interval '1 second' + r * interval '1 ms',
		       CASE WHEN r = 2 AND s % 7 = 0 THEN NULL ELSE s * 100000000 + ((r * s * 7919) % 997) * 1000 + r * 3000000 END,
		       CASE WHEN r = 1 AND s % 11 = 0 THEN NULL WHEN r = 3 AND s = 123 THEN 'NaN'::float8 ELSE ((s * r * 31) % 89) / 7.0 END,
		       CASE WHEN s % 13 = 0 THEN NULL ELSE 100 + (s * 31 + r) % 17 END
		FROM generate_series(0::bigint, 349) s, generate_series(0, 3) r
		WHERE NOT (r = 3 AND s BETWEEN 200 AND 209)`)
	// An older row of rank 0, step 50: the newest is the one that counts.
	exec(`INSERT INTO steps (run_id, rank, step, time, sync_ns, sync_wait_ms, step_ms)
		VALUES ('r', 0, 50, '2025-12-31', 1, 99, 1)`)
	exec(`INSERT INTO rollup_dirty (run_id, rank, block) SELECT DISTINCT run_id, rank, step / 100 FROM steps`)
	check := func(what string) {
		t.Helper()
		if _, err := s.RefreshRollups(ctx, "r"); err != nil {
			t.Fatal(err)
		}
		got := query(t, s, `
			SELECT rank, bucket, metric, first_step, first_time, last_time, min, max, sum, count FROM metric_rollups
			WHERE run_id = 'r' AND width = 100 AND metric = ANY($1) ORDER BY 1, 2, 3`, store.SyncMetrics)
		want := query(t, s, `
			SELECT rank, bucket, metric, first_step, first_time, last_time, min, max, sum, count
			FROM (`+store.SyncRollupSQL+`) x(run_id, rank, width, bucket, metric, first_step, first_time, last_time, min, max, sum, count)
			ORDER BY 1, 2, 3`, "r", []int64{0, 1, 2, 3, 4}, []int32{0, 1, 2, 3})
		if len(want) < 4*4*3 {
			t.Fatalf("%s: the reference gave %d rows: the data lost its point", what, len(want))
		}
		compareRows(t, what, got, want)
	}
	check("cold refresh")
	// Rank 3 reports the steps it missed, and a new block begins.
	exec(`INSERT INTO steps (run_id, rank, step, time, sync_ns, sync_wait_ms, step_ms)
		SELECT 'r', r, s, '2026-01-02'::timestamptz + s * interval '1 second', s * 100000000 + r * 7000000, r + 0.25, 120
		FROM generate_series(200::bigint, 209) s, (VALUES (3)) v(r)
		UNION ALL
		SELECT 'r', r, s, '2026-01-02'::timestamptz + s * interval '1 second', s * 100000000 + r * 7000000, r + 0.25, 120
		FROM generate_series(400::bigint, 420) s, generate_series(0, 3) r`)
	exec(`INSERT INTO rollup_dirty (run_id, rank, block) VALUES ('r', 3, 2), ('r', 0, 4), ('r', 1, 4), ('r', 2, 4), ('r', 3, 4)
		ON CONFLICT (run_id, rank, block) DO UPDATE SET seq = rollup_dirty.seq + 1`)
	check("incremental refresh")
}
