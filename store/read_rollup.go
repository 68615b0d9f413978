package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Rollup widths, in steps. Width 100 is one rollup_dirty block; each
// coarser width is a whole number of the finer one.
var RollupWidths = []int64{100, 1000, 10000}

// StepMetrics lists the numeric columns of steps that series and rollups
// know by name. User metrics are addressed as "metrics.NAME".
var StepMetrics = []string{
	"loss", "lr", "grad_norm", "loss_scale", "epoch", "samples", "tokens",
	"throughput_sps", "throughput_tps", "step_ms", "forward_ms", "backward_ms",
	"optimizer_ms", "comm_ms", "data_ms", "gpu_util_pct", "gpu_mem_used_gb",
	"gpu_mem_peak_gb", "gpu_mem_reserved_gb", "cpu_util_pct",
}

// IsStepMetric reports whether name is a built-in step metric.
func IsStepMetric(name string) bool {
	for _, m := range StepMetrics {
		if m == name {
			return true
		}
	}
	return false
}

// refreshChunk bounds the dirty blocks refreshed in one transaction, so
// that a cold refresh of a long run neither holds one huge transaction nor
// keeps ingest waiting on the markers it deletes.
const refreshChunk = 500

// RefreshRollups brings the rollups of runID up to date: it recomputes
// every bucket covering a block listed in rollup_dirty from the raw rows,
// then the coarser buckets above them, and deletes the markers, a chunk of
// blocks per transaction. Concurrent readers see either the old or the new
// rollups of a chunk, never a mix; concurrent refreshes of one run take
// turns on a transaction-scoped advisory lock. It returns the number of
// blocks refreshed.
func (s *Store) RefreshRollups(ctx context.Context, runID string) (int, error) {
	var dirty bool
	if err := s.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM rollup_dirty WHERE run_id = $1)`, runID).Scan(&dirty); err != nil {
		return 0, fmt.Errorf("store: check rollup markers: %w", err)
	}
	if !dirty {
		return 0, nil
	}
	total := 0
	for {
		n, err := s.refreshChunk(ctx, runID)
		if err != nil {
			return total, err
		}
		total += n
		if n < refreshChunk {
			return total, nil
		}
	}
}

func (s *Store) refreshChunk(ctx context.Context, runID string) (int, error) {
	start := time.Now()
	n := 0
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('rollup:' || $1, 0))`, runID); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		// Deleting the markers first means a write committed after this
		// statement leaves a marker of its own for the next refresh.
		rows, err := tx.Query(ctx, `
			DELETE FROM rollup_dirty d
			USING (SELECT rank, block FROM rollup_dirty WHERE run_id = $1
			       ORDER BY rank, block LIMIT $2) c
			WHERE d.run_id = $1 AND d.rank = c.rank AND d.block = c.block
			RETURNING d.rank, d.block`, runID, refreshChunk)
		if err != nil {
			return fmt.Errorf("take markers: %w", err)
		}
		var ranks []int32
		var blocks []int64
		for rows.Next() {
			var r int32
			var b int64
			if err := rows.Scan(&r, &b); err != nil {
				rows.Close()
				return fmt.Errorf("take markers: %w", err)
			}
			ranks = append(ranks, r)
			blocks = append(blocks, b)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("take markers: %w", err)
		}
		n = len(blocks)
		if n == 0 {
			return nil
		}
		if err := refreshMetricBlocks(ctx, tx, runID, ranks, blocks); err != nil {
			return err
		}
		if err := refreshLayerBlocks(ctx, tx, runID, ranks, blocks); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("store: refresh rollups of %s: %w", runID, err)
	}
	s.log.Debug("refreshed rollups", "run_id", runID, "blocks", n, "took", time.Since(start))
	return n, nil
}

// rollupMetrics are the rolled-up metrics: the step metrics plus "step"
// itself (its count is the number of rows, its min and max the span) and
// "skipped" (its sum is the number of skipped steps).
var rollupMetrics = append([]string{"step", "skipped"}, StepMetrics...)

// metricAggregates returns the per-bucket aggregates of every rolled-up
// metric and the VALUES list that turns them into one row per metric:
// ('loss', mn_loss, mx_loss, sm_loss, n_loss), …
func metricAggregates() (aggs, unpivot string) {
	var a, u []string
	for _, m := range rollupMetrics {
		expr := m + "::float8"
		if m == "skipped" {
			expr = "skipped::int::float8"
		}
		a = append(a, fmt.Sprintf("min(%[2]s) AS mn_%[1]s, max(%[2]s) AS mx_%[1]s, sum(%[2]s) AS sm_%[1]s, count(%[2]s) AS n_%[1]s", m, expr))
		u = append(u, fmt.Sprintf("('%[1]s', mn_%[1]s, mx_%[1]s, sm_%[1]s, n_%[1]s)", m))
	}
	return strings.Join(a, ",\n"), strings.Join(u, ",\n")
}

var refreshMetricsSQL = func() string {
	aggs, unpivot := metricAggregates()
	return `
WITH d AS (SELECT * FROM unnest($2::int[], $3::bigint[]) AS d(rank, block)),
r AS (
	SELECT s.* FROM d JOIN steps s
	ON s.run_id = $1 AND s.rank = d.rank AND s.step >= d.block * 100 AND s.step < d.block * 100 + 100
),
b AS (
	SELECT rank, step / 100 AS bucket, min(step) AS first_step,
	       (array_agg(time ORDER BY step))[1] AS first_time,
	       ` + aggs + `
	FROM r GROUP BY rank, step / 100
),
u AS (
	SELECT r.rank, r.step / 100 AS bucket, 'metrics.' || kv.key AS metric,
	       min(r.step) AS first_step, (array_agg(r.time ORDER BY r.step))[1] AS first_time,
	       min(v) AS mn, max(v) AS mx, sum(v) AS sm, count(v) AS n
	FROM r, jsonb_each_text(CASE WHEN jsonb_typeof(r.metrics) = 'object' THEN r.metrics ELSE '{}'::jsonb END) kv,
	     LATERAL (SELECT CASE WHEN kv.value ~* '^\s*[-+]?([0-9.]+([eE][-+]?[0-9]+)?|NaN|Infinity|inf)\s*$'
	                          THEN kv.value::float8 END AS v) x
	GROUP BY 1, 2, 3
)
INSERT INTO metric_rollups (run_id, rank, width, bucket, metric, first_step, first_time, min, max, sum, count)
SELECT $1, b.rank, 100, b.bucket, m.metric, b.first_step, b.first_time, m.mn, m.mx, m.sm, m.n
FROM b CROSS JOIN LATERAL (VALUES ` + unpivot + `) AS m(metric, mn, mx, sm, n)
WHERE m.n > 0
UNION ALL
SELECT $1, rank, 100, bucket, metric, first_step, first_time, mn, mx, sm, n FROM u WHERE n > 0`
}()

// parentMetricsSQL recomputes the buckets of width $4 that cover the given
// buckets of width $5 = $4 / 10 from those finer rows.
const parentMetricsSQL = `
WITH p AS (SELECT DISTINCT rank, bucket FROM unnest($2::int[], $3::bigint[]) AS p(rank, bucket))
INSERT INTO metric_rollups (run_id, rank, width, bucket, metric, first_step, first_time, min, max, sum, count)
SELECT $1, m.rank, $4, m.bucket * $5 / $4, m.metric, min(m.first_step),
       (array_agg(m.first_time ORDER BY m.first_step))[1], min(m.min), max(m.max), sum(m.sum), sum(m.count)::bigint
FROM p JOIN metric_rollups m
ON m.run_id = $1 AND m.rank = p.rank AND m.width = $5
   AND m.bucket >= p.bucket * $4 / $5 AND m.bucket < (p.bucket + 1) * $4 / $5
GROUP BY m.rank, m.metric, m.bucket * $5 / $4`

func refreshMetricBlocks(ctx context.Context, tx pgx.Tx, runID string, ranks []int32, blocks []int64) error {
	if _, err := tx.Exec(ctx, `
		DELETE FROM metric_rollups m USING unnest($2::int[], $3::bigint[]) AS d(rank, block)
		WHERE m.run_id = $1 AND m.rank = d.rank AND m.width = 100 AND m.bucket = d.block`, runID, ranks, blocks); err != nil {
		return fmt.Errorf("clear metric rollups: %w", err)
	}
	if _, err := tx.Exec(ctx, refreshMetricsSQL, runID, ranks, blocks); err != nil {
		return fmt.Errorf("compute metric rollups: %w", err)
	}
	child := blocks
	for i := 1; i < len(RollupWidths); i++ {
		w, cw := RollupWidths[i], RollupWidths[i-1]
		parents := parentBuckets(child, w/cw)
		if _, err := tx.Exec(ctx, `
			DELETE FROM metric_rollups m USING (SELECT DISTINCT * FROM unnest($2::int[], $3::bigint[])) AS d(rank, bucket)
			WHERE m.run_id = $1 AND m.rank = d.rank AND m.width = $4 AND m.bucket = d.bucket`, runID, ranks, parents, w); err != nil {
			return fmt.Errorf("clear metric rollups of width %d: %w", w, err)
		}
		if _, err := tx.Exec(ctx, parentMetricsSQL, runID, ranks, parents, w, cw); err != nil {
			return fmt.Errorf("compute metric rollups of width %d: %w", w, err)
		}
		child = parents
	}
	return nil
}

func parentBuckets(child []int64, factor int64) []int64 {
	out := make([]int64, len(child))
	for i, b := range child {
		out[i] = b / factor
	}
	return out
}

const refreshLayersSQL = `
WITH d AS (SELECT * FROM unnest($2::int[], $3::bigint[]) AS d(rank, block)),
r AS (
	SELECT l.rank, l.step / 100 AS bucket, l.step, l.time, l.forward_ms, l.backward_ms
	FROM d JOIN layer_times l
	ON l.run_id = $1 AND l.rank = d.rank AND l.step >= d.block * 100 AND l.step < d.block * 100 + 100
),
h AS (
	SELECT rank, bucket, min(step) AS first_step, (array_agg(time ORDER BY step))[1] AS first_time, count(*) AS n
	FROM r GROUP BY 1, 2
),
f AS (
	SELECT rank, bucket, array_agg(coalesce(s, 0) ORDER BY i) AS sums, array_agg(c ORDER BY i) AS counts
	FROM (SELECT r.rank, r.bucket, u.i, sum(u.v) AS s, count(u.v) AS c
	      FROM r, unnest(r.forward_ms) WITH ORDINALITY u(v, i) GROUP BY 1, 2, 3) x
	GROUP BY 1, 2
),
bw AS (
	SELECT rank, bucket, array_agg(coalesce(s, 0) ORDER BY i) AS sums, array_agg(c ORDER BY i) AS counts
	FROM (SELECT r.rank, r.bucket, u.i, sum(u.v) AS s, count(u.v) AS c
	      FROM r, unnest(coalesce(r.backward_ms, '{}')) WITH ORDINALITY u(v, i) GROUP BY 1, 2, 3) x
	GROUP BY 1, 2
)
INSERT INTO layer_rollups (run_id, rank, width, bucket, first_step, first_time, rows, fwd_sums, fwd_counts, bwd_sums, bwd_counts)
SELECT $1, h.rank, 100, h.bucket, h.first_step, h.first_time, h.n,
       coalesce(f.sums, '{}'), coalesce(f.counts, '{}'), coalesce(bw.sums, '{}'), coalesce(bw.counts, '{}')
FROM h LEFT JOIN f USING (rank, bucket) LEFT JOIN bw USING (rank, bucket)`

// parentLayersSQL sums per-layer arrays of finer buckets element-wise.
const parentLayersSQL = `
WITH p AS (SELECT DISTINCT rank, bucket FROM unnest($2::int[], $3::bigint[]) AS p(rank, bucket)),
c AS (
	SELECT l.* FROM p JOIN layer_rollups l
	ON l.run_id = $1 AND l.rank = p.rank AND l.width = $5
	   AND l.bucket >= p.bucket * $4 / $5 AND l.bucket < (p.bucket + 1) * $4 / $5
),
h AS (
	SELECT rank, bucket * $5 / $4 AS bucket, min(first_step) AS first_step,
	       (array_agg(first_time ORDER BY first_step))[1] AS first_time, sum(rows)::bigint AS n
	FROM c GROUP BY 1, 2
),
f AS (
	SELECT rank, bucket, array_agg(s ORDER BY i) AS sums, array_agg(n ORDER BY i) AS counts
	FROM (SELECT c.rank, c.bucket * $5 / $4 AS bucket, u.i, sum(u.s) AS s, sum(u.n)::bigint AS n
	      FROM c, unnest(c.fwd_sums, c.fwd_counts) WITH ORDINALITY u(s, n, i) GROUP BY 1, 2, 3) x
	GROUP BY 1, 2
),
bw AS (
	SELECT rank, bucket, array_agg(s ORDER BY i) AS sums, array_agg(n ORDER BY i) AS counts
	FROM (SELECT c.rank, c.bucket * $5 / $4 AS bucket, u.i, sum(u.s) AS s, sum(u.n)::bigint AS n
	      FROM c, unnest(c.bwd_sums, c.bwd_counts) WITH ORDINALITY u(s, n, i) GROUP BY 1, 2, 3) x
	GROUP BY 1, 2
)
INSERT INTO layer_rollups (run_id, rank, width, bucket, first_step, first_time, rows, fwd_sums, fwd_counts, bwd_sums, bwd_counts)
SELECT $1, h.rank, $4, h.bucket, h.first_step, h.first_time, h.n,
       coalesce(f.sums, '{}'), coalesce(f.counts, '{}'), coalesce(bw.sums, '{}'), coalesce(bw.counts, '{}')
FROM h LEFT JOIN f USING (rank, bucket) LEFT JOIN bw USING (rank, bucket)`

func refreshLayerBlocks(ctx context.Context, tx pgx.Tx, runID string, ranks []int32, blocks []int64) error {
	if _, err := tx.Exec(ctx, `
		DELETE FROM layer_rollups l USING unnest($2::int[], $3::bigint[]) AS d(rank, block)
		WHERE l.run_id = $1 AND l.rank = d.rank AND l.width = 100 AND l.bucket = d.block`, runID, ranks, blocks); err != nil {
		return fmt.Errorf("clear layer rollups: %w", err)
	}
	if _, err := tx.Exec(ctx, refreshLayersSQL, runID, ranks, blocks); err != nil {
		return fmt.Errorf("compute layer rollups: %w", err)
	}
	child := blocks
	for i := 1; i < len(RollupWidths); i++ {
		w, cw := RollupWidths[i], RollupWidths[i-1]
		parents := parentBuckets(child, w/cw)
		if _, err := tx.Exec(ctx, `
			DELETE FROM layer_rollups l USING (SELECT DISTINCT * FROM unnest($2::int[], $3::bigint[])) AS d(rank, bucket)
			WHERE l.run_id = $1 AND l.rank = d.rank AND l.width = $4 AND l.bucket = d.bucket`, runID, ranks, parents, w); err != nil {
			return fmt.Errorf("clear layer rollups of width %d: %w", w, err)
		}
		if _, err := tx.Exec(ctx, parentLayersSQL, runID, ranks, parents, w, cw); err != nil {
			return fmt.Errorf("compute layer rollups of width %d: %w", w, err)
		}
		child = parents
	}
	return nil
}
