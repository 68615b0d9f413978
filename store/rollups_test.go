package store_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// TestRefreshRollupsMatchRawAggregates checks every rollup width against
// SQL aggregates of the raw rows, on data with NULLs, NaN, an infinity,
// ragged and missing layer arrays, two ranks and user metrics, after a
// cold refresh and after an incremental one.
func TestRefreshRollupsMatchRawAggregates(t *testing.T) {
	s := storetest.NewStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := storetest.Pool(t, s).Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`INSERT INTO runs (run_id, layer_names) VALUES ('r', '{a,b,c,d}')`)
	// 23,456 steps on rank 0, a shorter rank 3 with gaps; every 997th loss
	// NaN, every 10th NULL, one +Inf grad norm.
	exec(`INSERT INTO steps (run_id, rank, step, time, loss, grad_norm, skipped, samples, step_ms, metrics)
		SELECT 'r', r, s, '2026-01-01'::timestamptz + s * interval '1 second' + r * interval '1 ms',
		       CASE WHEN s % 997 = 0 THEN 'NaN'::float8 WHEN s % 10 = 0 THEN NULL ELSE 3 - s / 1e5 + r END,
		       CASE WHEN s = 12345 THEN 'Infinity'::float8 ELSE s % 17 END,
		       s % 50 = 0, s * 32, 100 + (s * 7919) % 101,
		       CASE WHEN s % 3 = 0 THEN jsonb_build_object('tok', s % 11, 'name', 'x') END
		FROM generate_series(0, 23455) s, (VALUES (0), (3)) ranks(r)
		WHERE r = 0 OR (s % 1000 < 600 AND s < 15000)`)
	exec(`INSERT INTO layer_times (run_id, rank, step, time, forward_ms, backward_ms)
		SELECT 'r', r, s, '2026-01-01'::timestamptz + s * interval '1 second',
		       CASE WHEN s % 5 = 0 THEN ARRAY[1.5, NULL, s % 7, 'NaN']::float8[]
		            WHEN s % 5 = 1 THEN ARRAY[s % 13, 2]::float8[]
		            ELSE ARRAY[0.25 * (s % 4), 1, 2, 3]::float8[] END,
		       CASE WHEN s % 2 = 0 THEN ARRAY[s % 3, 4, 5, 6]::float8[] END
		FROM generate_series(0, 23455) s, (VALUES (0), (3)) ranks(r)
		WHERE (r = 0 AND s % 4000 < 3500) OR (r = 3 AND s BETWEEN 2000 AND 2999)`)
	exec(`INSERT INTO rollup_dirty (run_id, rank, block)
		SELECT DISTINCT run_id, rank, step / 100 FROM steps
		UNION SELECT DISTINCT run_id, rank, step / 100 FROM layer_times`)
	refresh := func() {
		t.Helper()
		n, err := s.RefreshRollups(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatal("refresh found no markers")
		}
		var left int
		if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT count(*) FROM rollup_dirty`).Scan(&left); err != nil || left != 0 {
			t.Fatalf("markers left after refresh: %d (%v)", left, err)
		}
	}
	refresh()
	checkRollups(t, s)

	// Rewrite a step, add steps in a new block and a new layer row, and
	// mark only those blocks: coarser buckets must still cover the
	// untouched ones.
	exec(`UPDATE steps SET loss = 1000, metrics = '{"tok": 99}' WHERE rank = 0 AND step = 5055`)
	exec(`INSERT INTO steps (run_id, rank, step, time, loss) VALUES ('r', 0, 30001, '2026-02-01', 7), ('r', 0, 30099, '2026-02-02', -1)`)
	exec(`INSERT INTO layer_times (run_id, rank, step, time, forward_ms) VALUES ('r', 0, 3999, '2026-02-01', '{9,9,9,9,9}')`)
	exec(`INSERT INTO rollup_dirty (run_id, rank, block) VALUES ('r', 0, 50), ('r', 0, 300), ('r', 0, 39)`)
	refresh()
	checkRollups(t, s)
}

func checkRollups(t *testing.T, s *store.Store) {
	t.Helper()
	for _, w := range store.RollupWidths {
		for _, m := range []struct{ name, expr string }{
			{"step", "step::float8"},
			{"skipped", "skipped::int::float8"},
			{"loss", "loss"},
			{"grad_norm", "grad_norm"},
			{"samples", "samples::float8"},
			{"step_ms", "step_ms"},
			{"metrics.tok", "(metrics->>'tok')::float8"},
		} {
			want := query(t, s, fmt.Sprintf(`
				SELECT rank, step / %[1]d, min(step), (array_agg(time ORDER BY step))[1], min(%[2]s), max(%[2]s), sum(%[2]s), count(%[2]s)
				FROM steps WHERE run_id = 'r' AND %[2]s IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2`, w, m.expr))
			got := query(t, s, `
				SELECT rank, bucket, first_step, first_time, min, max, sum, count FROM metric_rollups
				WHERE run_id = 'r' AND width = $1 AND metric = $2 ORDER BY 1, 2`, w, m.name)
			// first_step/first_time are the bucket's, which the
			// metric's non-NULL rows need not start; compare them for
			// metrics present on every row.
			if m.name != "step" && m.name != "samples" && m.name != "step_ms" {
				for _, r := range append(want, got...) {
					r[2], r[3] = nil, nil
				}
			}
			compareRows(t, fmt.Sprintf("metric %s width %d", m.name, w), got, want)
		}
		// Counts stored NULL are the bucket's rows, once per layer.
		for _, pass := range []struct{ raw, sums, counts string }{
			{"forward_ms", "fwd_sums", "coalesce(fwd_counts, array_fill(rows, ARRAY[cardinality(fwd_sums)]))"},
			{"backward_ms", "bwd_sums", "coalesce(bwd_counts, array_fill(rows, ARRAY[cardinality(bwd_sums)]))"},
		} {
			want := query(t, s, fmt.Sprintf(`
				SELECT rank, step / %[1]d, i, coalesce(sum(v), 0), count(v)
				FROM layer_times, unnest(%[2]s) WITH ORDINALITY u(v, i) WHERE run_id = 'r'
				GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`, w, pass.raw))
			got := query(t, s, fmt.Sprintf(`
				SELECT rank, bucket, i, s, n FROM layer_rollups, unnest(%s, %s) WITH ORDINALITY u(s, n, i)
				WHERE run_id = 'r' AND width = $1 ORDER BY 1, 2, 3`, pass.sums, pass.counts), w)
			compareRows(t, fmt.Sprintf("layers %s width %d", pass.raw, w), got, want)
		}
		want := query(t, s, fmt.Sprintf(`
			SELECT rank, step / %[1]d, count(*), min(step), (array_agg(time ORDER BY step))[1]
			FROM layer_times WHERE run_id = 'r' GROUP BY 1, 2 ORDER BY 1, 2`, w))
		got := query(t, s, `SELECT rank, bucket, rows, first_step, first_time FROM layer_rollups
			WHERE run_id = 'r' AND width = $1 ORDER BY 1, 2`, w)
		compareRows(t, fmt.Sprintf("layer buckets width %d", w), got, want)
	}
}

func query(t *testing.T, s *store.Store, q string, args ...any) [][]any {
	t.Helper()
	rows, err := storetest.Pool(t, s).Query(context.Background(), q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var out [][]any
	for rows.Next() {
		v, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// compareRows compares numbers numerically (sums may be added in another
// order), NaN equal to NaN, and everything else exactly.
func compareRows(t *testing.T, what string, got, want [][]any) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d rows, want %d", what, len(got), len(want))
	}
	num := func(v any) (float64, bool) {
		switch x := v.(type) {
		case float64:
			return x, true
		case int64:
			return float64(x), true
		case int32:
			return float64(x), true
		}
		return 0, false
	}
	for i := range want {
		for j := range want[i] {
			g, w := got[i][j], want[i][j]
			gf, gok := num(g)
			wf, wok := num(w)
			switch {
			case gok && wok:
				if gf == wf || (math.IsNaN(gf) && math.IsNaN(wf)) || math.Abs(gf-wf) <= 1e-9*math.Max(1, math.Abs(wf)) {
					continue
				}
			case fmt.Sprint(g) == fmt.Sprint(w):
				continue
			}
			t.Fatalf("%s: row %d column %d = %v, want %v (row %v, want %v)", what, i, j, g, w, got[i], want[i])
		}
	}
}
