package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Rollups across ranks (docs/scale.md). A block of 100 steps is refreshed
// whole, for every rank, whenever any rank wrote into it: the figures
// below compare the ranks of each step, so one late rank changes everyone's.

// SyncMetrics are the per-rank metrics computed across the ranks of each
// step, rolled up beside the step metrics (as sets of their own,
// rollups_sets.go) over the steps that every rank of the run reported:
//
//	lateness_ms        arrival at the step's synchronisation point after the
//	                   first rank's, host clocks aligned by an offset
//	                   estimated over each block (docs/ranks.md)
//	busy_ms            step time less the wait in the collective
//	straggler_wait_ms  wait in the collective beyond the shortest wait of
//	                   the step: time lost to the slowest rank
//	last_arrival       1 when the rank arrived last (and late), else 0
var SyncMetrics = []string{"lateness_ms", "busy_ms", "straggler_wait_ms", "last_arrival"}

// spreadSQL recomputes metric_spread of width $2 in the buckets $3 from
// every rank's rollups of the same buckets.
const spreadSQL = `
INSERT INTO metric_spread (run_id, metric, width, bucket, first_step, first_time, last_time, min, max, sum, count, ranks,
	mean_min, mean_p5, mean_p50, mean_p95, mean_max, max_rank)
SELECT $1, metric, $2, bucket, fs, ft, lt, mn, mx, sm, n, nr, mean_min, q[1], q[2], q[3], mean_max, max_rank FROM (
	SELECT metric, bucket, min(first_step) AS fs, (array_agg(first_time ORDER BY first_step))[1] AS ft, max(last_time) AS lt,
	       min(min) AS mn, max(max) AS mx, sum(sum) AS sm, sum(count)::bigint AS n, count(*)::int AS nr,
	       min(mean) AS mean_min, max(mean) AS mean_max,
	       percentile_cont(ARRAY[0.05, 0.5, 0.95]) WITHIN GROUP (ORDER BY mean) AS q,
	       (array_agg(rank ORDER BY mean DESC, rank))[1] AS max_rank
	FROM (
		SELECT m.*, m.sum / m.count AS mean
		FROM unnest($3::bigint[]) AS p(bucket) JOIN metric_rollups m
		ON m.run_id = $1 AND m.width = $2 AND m.bucket = p.bucket
		WHERE m.rank >= 0 AND m.count > 0
	) x GROUP BY metric, bucket
) g`

// refreshSpreadBlocks recomputes, for the blocks that keys touch, every
// rank's SyncMetrics rollups and the run's metric_spread at every width.
// It runs in the refresh's transaction, after the metric rollups of keys.
func refreshSpreadBlocks(ctx context.Context, tx pgx.Tx, runID string, keys []bucketKey) error {
	blocks := make([]int64, 0, len(keys))
	for _, k := range keys {
		blocks = append(blocks, k.bucket)
	}
	slices.Sort(blocks)
	blocks = slices.Compact(blocks)
	if _, err := tx.Exec(ctx, `DELETE FROM metric_rollup_sets WHERE run_id = $1 AND width = 100 AND bucket = ANY($2) AND part = $3`,
		runID, blocks, syncSet); err != nil {
		return fmt.Errorf("clear synchronisation rollups: %w", err)
	}
	all, err := runRanks(ctx, tx, runID)
	if err != nil {
		return err
	}
	ranks32 := make([]int32, len(all))
	for i, r := range all {
		ranks32[i] = int32(r)
	}
	if err := refreshSyncBlocks(ctx, tx, runID, blocks, ranks32); err != nil {
		return err
	}
	child := blocks
	for i, w := range RollupWidths {
		buckets := child
		if i > 0 {
			cw := RollupWidths[i-1]
			buckets = make([]int64, 0, len(child))
			for _, b := range child {
				buckets = append(buckets, b*cw/w)
			}
			buckets = slices.Compact(buckets)
			if _, err := tx.Exec(ctx, `DELETE FROM metric_rollup_sets WHERE run_id = $1 AND width = $2 AND bucket = ANY($3) AND part = $4`,
				runID, w, buckets, syncSet); err != nil {
				return fmt.Errorf("clear synchronisation rollups of width %d: %w", w, err)
			}
			if _, err := tx.Exec(ctx, parentSyncSetsSQL, runID, buckets, w, cw); err != nil {
				return fmt.Errorf("compute synchronisation rollups of width %d: %w", w, err)
			}
		}
		if _, err := tx.Exec(ctx, `DELETE FROM metric_spread WHERE run_id = $1 AND width = $2 AND bucket = ANY($3)`,
			runID, w, buckets); err != nil {
			return fmt.Errorf("clear spread of width %d: %w", w, err)
		}
		if _, err := tx.Exec(ctx, spreadSQL, runID, w, buckets); err != nil {
			return fmt.Errorf("compute spread of width %d: %w", w, err)
		}
		child = buckets
	}
	var ranks []int32
	rows, err := tx.Query(ctx, `SELECT DISTINCT rank FROM metric_rollups WHERE run_id = $1 AND width = $2 AND bucket = ANY($3) ORDER BY 1`,
		runID, RollupWidths[len(RollupWidths)-1], child)
	if err == nil {
		ranks, err = pgx.CollectRows(rows, pgx.RowTo[int32])
	}
	if err != nil {
		return fmt.Errorf("list ranks: %w", err)
	}
	if err := refreshTotals(ctx, tx, runID, ranks, SyncMetrics); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM metric_spread WHERE run_id = $1 AND width = $2`, runID, TotalWidth); err != nil {
		return fmt.Errorf("clear spread of the whole run: %w", err)
	}
	if _, err := tx.Exec(ctx, spreadSQL, runID, TotalWidth, []int64{0}); err != nil {
		return fmt.Errorf("compute spread of the whole run: %w", err)
	}
	return nil
}

// TotalWidth is the width of the rollups of a rank's whole run (bucket 0),
// which sum its rollups of the widest width: a view of a thousand ranks
// reads one row a rank and metric.
const TotalWidth = 0

// refreshTotals recomputes the whole-run rollups of ranks from their
// widest rollups, for metrics (nil: every metric).
func refreshTotals(ctx context.Context, tx pgx.Tx, runID string, ranks []int32, metrics []string) error {
	w := RollupWidths[len(RollupWidths)-1]
	if _, err := tx.Exec(ctx, `DELETE FROM metric_rollup_rows m USING unnest($2::int[]) AS r(rank)
		WHERE m.run_id = $1 AND m.rank = r.rank AND m.width = $3 AND ($4::text[] IS NULL OR m.metric = ANY($4))`,
		runID, ranks, TotalWidth, metrics); err != nil {
		return fmt.Errorf("clear whole-run rollups: %w", err)
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO metric_rollup_rows (run_id, rank, width, bucket, metric, first_step, first_time, last_time, min, max, sum, count)
		SELECT $1, m.rank, $3, 0, m.metric, min(m.first_step), (array_agg(m.first_time ORDER BY m.first_step))[1], max(m.last_time),
		       min(m.min), max(m.max), sum(m.sum ORDER BY m.bucket), sum(m.count)::bigint
		FROM unnest($2::int[]) AS r(rank) JOIN metric_rollups m ON m.run_id = $1 AND m.rank = r.rank AND m.width = $4
		WHERE $5::text[] IS NULL OR m.metric = ANY($5)
		GROUP BY m.rank, m.metric`, runID, ranks, TotalWidth, w, metrics); err != nil {
		return fmt.Errorf("compute whole-run rollups: %w", err)
	}
	return nil
}

// uniqueRanks returns the distinct ranks of keys (sorted by rank).
func uniqueRanks(keys []bucketKey) []int32 {
	var out []int32
	for _, k := range keys {
		if len(out) == 0 || out[len(out)-1] != k.rank {
			out = append(out, k.rank)
		}
	}
	return out
}

// SpreadRow is one bucket of metric_spread: the aggregate over every
// rank's rows and the distribution of the ranks' means.
type SpreadRow struct {
	Bucket           int64
	FirstStep        int64
	FirstTime        time.Time
	Min, Max, Sum    float64
	Count            int64
	Ranks            int
	MeanMin, P5, P50 float64
	P95, MeanMax     float64
	MaxRank          int
}

// MetricSpread reads the spread of metric over the buckets [fromBucket,
// toBucket] of width w.
func (s *Store) MetricSpread(ctx context.Context, runID, metric string, w, fromBucket, toBucket int64) ([]SpreadRow, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT bucket, first_step, first_time, coalesce(min, 'NaN'), coalesce(max, 'NaN'), coalesce(sum, 'NaN'), count, ranks,
		       coalesce(mean_min, 'NaN'), coalesce(mean_p5, 'NaN'), coalesce(mean_p50, 'NaN'), coalesce(mean_p95, 'NaN'),
		       coalesce(mean_max, 'NaN'), coalesce(max_rank, -1)
		FROM metric_spread WHERE run_id = $1 AND metric = $2 AND width = $3 AND bucket >= $4 AND bucket <= $5
		ORDER BY bucket`, runID, metric, w, fromBucket, toBucket)
	if err != nil {
		return nil, fmt.Errorf("store: spread of %s of %s: %w", metric, runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SpreadRow, error) {
		var p SpreadRow
		err := r.Scan(&p.Bucket, &p.FirstStep, &p.FirstTime, &p.Min, &p.Max, &p.Sum, &p.Count, &p.Ranks,
			&p.MeanMin, &p.P5, &p.P50, &p.P95, &p.MeanMax, &p.MaxRank)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: spread of %s of %s: %w", metric, runID, err)
	}
	return out, nil
}

// TopRanks returns up to k ranks with the largest whole-run mean of
// metric, largest first (a NaN mean counts as largest).
func (s *Store) TopRanks(ctx context.Context, runID, metric string, k int) ([]int, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT rank FROM metric_rollup_rows WHERE run_id = $1 AND width = $2 AND bucket = 0 AND metric = $3 AND count > 0
		ORDER BY sum / count DESC NULLS LAST, rank LIMIT $4`, runID, TotalWidth, metric, k)
	if err != nil {
		return nil, fmt.Errorf("store: top ranks of %s by %s: %w", runID, metric, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("store: top ranks of %s by %s: %w", runID, metric, err)
	}
	return out, nil
}
