package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Lateness and busy time under synchronous training (docs/ranks.md), as
// SQL shared by RankSyncs (the medians of GET /runs/{id}/ranks) and
// LatenessBuckets (the lateness series): one formula, one clock offset
// estimate.

// completeSteps is the CTE pair name_s, name: the newest row of each rank
// and step of run $1 with lo <= step (<= hi unless hi is ""), kept for
// the steps every rank of that range reported (at least two ranks), with
// the step's counts of rows (nr), arrivals (na) and waits (nw). a is the
// arrival in milliseconds since the Unix epoch, w the wait in the
// collective.
func completeSteps(name, lo, hi string) string {
	upper := ""
	if hi != "" {
		upper = " AND step <= " + hi
	}
	return name + `_s AS (
			SELECT DISTINCT ON (rank, step) rank, step, time, sync_ns::float8 / 1e6 AS a, sync_wait_ms AS w, step_ms, input_wait_ms
			FROM steps WHERE run_id = $1 AND step >= ` + lo + upper + ` ORDER BY rank, step, time DESC
		), ` + name + ` AS (
			SELECT * FROM (
				SELECT *, count(*) OVER st AS nr, count(a) OVER st AS na, count(w) OVER st AS nw,
				       (SELECT count(DISTINCT rank) FROM ` + name + `_s) AS ranks
				FROM ` + name + `_s WINDOW st AS (PARTITION BY step)
			) f WHERE nr = ranks AND ranks >= 2
		)`
}

// Clock offsets are estimated per offsetKey: over the whole range of
// steps (perRank), or block by block (perBlock: a block is 100 steps), as
// the rollups do, so that a block's figures depend on its own steps only
// (rollups_sync.go folds the same figures in Go; its test holds them to
// this SQL).
const (
	perRank  = "rank"
	perBlock = "rank, block"
)

// clockOffsets is the CTE off: each rank's host clock offset (per key, a
// perRank or perBlock), the median over the steps of complete with
// arrivals and waits of its release (arrival + wait, the same instant on
// every rank) less the step's earliest release.
func clockOffsets(complete, key string) string {
	return `off AS (
			SELECT ` + key + `, percentile_cont(0.5) WITHIN GROUP (ORDER BY rel) AS off FROM (
				SELECT rank, step / 100 AS block, (a + w) - min(a + w) OVER (PARTITION BY step) AS rel
				FROM ` + complete + ` WHERE na = nr AND nw = nr
			) x GROUP BY ` + key + `
		)`
}

// lateness is the CTE l over the steps of complete, with off of the same
// key: each rank's lateness (arrival less its clock offset, after the
// step's first; or, without arrivals, the step's longest wait less its
// own), busy time, wait, wait beyond the step's shortest (excess, the
// time the slowest rank cost it) and what the lateness came from (src).
func lateness(complete, key string) string {
	return `l AS (
			SELECT c.rank, c.step, c.time, c.w, c.input_wait_ms, greatest(c.step_ms - coalesce(c.w, 0), 0) AS busy,
			       CASE WHEN c.na = c.nr THEN (c.a - coalesce(off.off, 0)) - min(c.a - coalesce(off.off, 0)) OVER (PARTITION BY c.step)
			            WHEN c.nw = c.nr THEN max(c.w) OVER (PARTITION BY c.step) - c.w END AS late,
			       CASE WHEN c.nw = c.nr THEN c.w - min(c.w) OVER (PARTITION BY c.step) END AS excess,
			       CASE WHEN c.na = c.nr THEN 'arrivals' WHEN c.nw = c.nr THEN 'waits' END AS src
			FROM (SELECT *, step / 100 AS block FROM ` + complete + `) c LEFT JOIN off USING (` + key + `)
		)`
}

// RankMetrics are the per-rank series computed across the ranks of a
// step rather than read from one rank's rows (docs/ranks.md): lateness
// at the synchronisation point and the straggler score the alert
// evaluator stores. They have no rollups.
var RankMetrics = []string{"lateness_ms", "straggler_score"}

// IsRankMetric reports whether name is one of RankMetrics.
func IsRankMetric(name string) bool { return slices.Contains(RankMetrics, name) }

// RankBucket is one rank's values of a per-rank series over the steps
// [k·width, (k+1)·width) of bucket k.
type RankBucket struct {
	Rank      int
	FirstStep int64
	FirstTime time.Time
	Min, Max  float64
	Sum       float64
	Count     int64
}

// LatenessBuckets returns each rank's lateness in milliseconds over the
// steps in [from, to], bucketed by width steps. The clock offsets are
// estimated over the steps from offsetsFrom on, as RankSyncs does for
// the same first step, so the series and GET /runs/{id}/ranks agree.
func (s *Store) LatenessBuckets(ctx context.Context, runID string, offsetsFrom, from, to, width int64) ([]RankBucket, error) {
	if width < 1 {
		return nil, fmt.Errorf("store: lateness of %s: bucket width %d", runID, width)
	}
	return s.rankBuckets(ctx, "lateness", runID, `
		WITH `+completeSteps("co", "$2", "")+`, `+clockOffsets("co", perRank)+`, `+completeSteps("c", "$3", "$4")+`, `+lateness("c", perRank)+`
		SELECT rank, min(step), (array_agg(time ORDER BY step))[1], min(late), max(late), sum(late), count(*)
		FROM l WHERE late IS NOT NULL GROUP BY rank, step / $5 ORDER BY rank, 2`,
		runID, offsetsFrom, from, to, width)
}

func (s *Store) rankBuckets(ctx context.Context, what, runID, sql string, args ...any) ([]RankBucket, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("store: %s of %s: %w", what, runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RankBucket, error) {
		var b RankBucket
		err := r.Scan(&b.Rank, &b.FirstStep, &b.FirstTime, &b.Min, &b.Max, &b.Sum, &b.Count)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: %s of %s: %w", what, runID, err)
	}
	return out, nil
}

// SyncBlock is one rank's rollup of a per-rank sync metric (SyncMetrics)
// over the block [Bucket·Width, (Bucket+1)·Width).
type SyncBlock struct {
	Rank      int
	Metric    string
	Bucket    int64
	FirstStep int64
	FirstTime time.Time
	Mean      float64
}

// SyncBlocks returns every rank's rollups of width of the metrics (of
// SyncMetrics) over the blocks holding steps from to to, ordered by
// bucket and rank: a few rows a rank a block, whatever the steps. The
// rollups must be fresh (RefreshRollups).
func (s *Store) SyncBlocks(ctx context.Context, runID string, width, from, to int64, metrics []string) ([]SyncBlock, error) {
	if !slices.Contains(RollupWidths, width) {
		return nil, fmt.Errorf("store: sync blocks of %s: no rollups of width %d", runID, width)
	}
	rows, err := s.pool.Query(ctx, `SELECT rank, metric, bucket, first_step, first_time, sum / count FROM metric_rollups
		WHERE run_id = $1 AND width = $2 AND bucket >= $3 AND bucket <= $4 AND metric = ANY($5) AND count > 0
		ORDER BY bucket, rank`, runID, width, from/width, to/width, metrics)
	if err != nil {
		return nil, fmt.Errorf("store: sync blocks of %s: %w", runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SyncBlock, error) {
		var b SyncBlock
		err := r.Scan(&b.Rank, &b.Metric, &b.Bucket, &b.FirstStep, &b.FirstTime, &b.Mean)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: sync blocks of %s: %w", runID, err)
	}
	return out, nil
}
