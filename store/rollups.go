package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
)

// Rollup widths, in steps. Width 100 is one rollup_dirty block; each
// coarser width is a whole number of the finer one.
var RollupWidths = []int64{100, 1000, 10000}

// StepMetrics lists the numeric columns of steps that series and rollups
// know by name: the step table's series (api.StepSeries). User metrics
// are addressed as "metrics.NAME".
var StepMetrics = api.StepSeries()

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
// keeps ingest waiting on the markers it deletes. A chunk takes whole
// blocks of every rank marked in them, and pays once for what covers them
// (the coarser buckets, each rank's whole-run rollups, the spread across
// ranks): at 1,024 ranks those were most of a one-block chunk, so a chunk
// takes about 5,000 rank-blocks, five blocks at 1,024 ranks, 500,000
// steps of one rank: seconds of work.
const refreshChunk = 5000

// afterMarkersRead, when set by a test, runs inside a refresh right after
// it has read its markers.
var afterMarkersRead func()

// RefreshRollups brings the rollups of runID up to date: it recomputes
// every bucket covering a block listed in rollup_dirty from the raw rows,
// then the coarser buckets above them, and deletes the markers, a chunk of
// blocks per transaction. Concurrent readers see either the old or the new
// rollups of a chunk, never a mix; concurrent refreshes of one run take
// turns on a transaction-scoped advisory lock. It returns the number of
// blocks refreshed.
func (s *Store) RefreshRollups(ctx context.Context, runID string) (int, error) {
	n, _, err := s.RefreshRollupsUpTo(ctx, runID, 0)
	return n, err
}

// RefreshRollupsUpTo is [Store.RefreshRollups] that stops after about
// maxBlocks blocks (whole chunks; 0 means no limit), so that a background
// refresher can share its time between runs. more reports that markers
// were left.
func (s *Store) RefreshRollupsUpTo(ctx context.Context, runID string, maxBlocks int) (n int, more bool, err error) {
	return s.RefreshRollupsWithin(ctx, runID, RefreshLimits{MaxBlocks: maxBlocks})
}

// RefreshRollupsWithin is [Store.RefreshRollups] within lim. A chunk
// that another refresh of the run holds the lock of (lim.NoWait), or
// whose statements pass lim.Timeout, is left for later: more is true and
// err nil, and the rollups stay as they were.
func (s *Store) RefreshRollupsWithin(ctx context.Context, runID string, lim RefreshLimits) (n int, more bool, err error) {
	maxBlocks := lim.MaxBlocks
	var dirty bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM rollup_dirty WHERE run_id = $1)`, runID).Scan(&dirty); err != nil {
		return 0, false, fmt.Errorf("store: check rollup markers: %w", err)
	}
	if !dirty {
		return 0, false, nil
	}
	for {
		c, err := s.refreshChunk(ctx, runID, lim)
		if errors.Is(err, errRefreshSkipped) {
			return n, true, nil
		}
		if err != nil {
			return n, true, err
		}
		n += c
		if c < refreshChunk {
			return n, false, nil
		}
		if maxBlocks > 0 && n >= maxBlocks {
			return n, true, nil
		}
	}
}

// DirtyRun is a run with rollup markers waiting for a refresh.
type DirtyRun struct {
	RunID  string
	Blocks int64     // markers waiting
	Since  time.Time // when the oldest of them was set
}

// DirtyRuns lists up to limit runs with rollup markers, the longest
// waiting first.
func (s *Store) DirtyRuns(ctx context.Context, limit int) ([]DirtyRun, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT run_id, count(*), min(marked_at) FROM rollup_dirty
		GROUP BY run_id ORDER BY min(marked_at), run_id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("store: list dirty runs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DirtyRun, error) {
		var d DirtyRun
		err := r.Scan(&d.RunID, &d.Blocks, &d.Since)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: list dirty runs: %w", err)
	}
	return out, nil
}

// DirtyBlocks counts the rollup markers of runs: the blocks waiting for a
// refresh.
func (s *Store) DirtyBlocks(ctx context.Context, runIDs []string) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM rollup_dirty WHERE run_id = ANY($1)`, runIDs).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count rollup markers: %w", err)
	}
	return n, nil
}

func (s *Store) refreshChunk(ctx context.Context, runID string, lim RefreshLimits) (int, error) {
	start := time.Now()
	n := 0
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := lockRefresh(ctx, tx, runID, lim); err != nil {
			return err
		}
		if err := refreshSettings(ctx, tx); err != nil {
			return err
		}
		// The markers are read without locking them, so ingest never waits
		// for a refresh. Every write into a block bumps its marker's seq
		// (or creates the marker) in the write's own transaction; the
		// markers are deleted at the end only where seq is still the one
		// read here. A write committed before the read is seen by every
		// statement below; one committed later leaves its marker behind
		// for the next refresh.
		//
		// A chunk takes whole blocks, the oldest steps first, for every
		// rank marked in them: the figures across ranks (rollups_spread.go)
		// are recomputed once per block, so a chunk that took a block for
		// some ranks only would recompute it again in the next one.
		rows, err := tx.Query(ctx, `
			SELECT rank, block, seq FROM rollup_dirty WHERE run_id = $1 AND block <= coalesce(
				(SELECT block FROM rollup_dirty WHERE run_id = $1 ORDER BY block, rank OFFSET $2 - 1 LIMIT 1), 9223372036854775807)
			ORDER BY rank, block`, runID, refreshChunk)
		if err != nil {
			return fmt.Errorf("read markers: %w", err)
		}
		var keys []bucketKey
		var seqs []int64
		for rows.Next() {
			var k bucketKey
			var seq int64
			if err := rows.Scan(&k.rank, &k.bucket, &seq); err != nil {
				rows.Close()
				return fmt.Errorf("read markers: %w", err)
			}
			keys = append(keys, k)
			seqs = append(seqs, seq)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read markers: %w", err)
		}
		n = len(keys)
		if n == 0 {
			return nil
		}
		if afterMarkersRead != nil {
			afterMarkersRead()
		}
		// The markers' ORDER BY leaves keys sorted, as the refresh
		// functions want them; ranks, blocks and seqs stay parallel.
		ranks := make([]int32, len(keys))
		blocks := make([]int64, len(keys))
		for i, k := range keys {
			ranks[i], blocks[i] = k.rank, k.bucket
		}
		if err := refreshMetricBlocks(ctx, tx, runID, keys); err != nil {
			return err
		}
		if err := refreshBlocks(ctx, tx, runID, keys, layerRollups); err != nil {
			return err
		}
		if err := refreshSpreadBlocks(ctx, tx, runID, keys); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `
			DELETE FROM rollup_dirty d
			USING unnest($2::int[], $3::bigint[], $4::bigint[]) AS c(rank, block, seq)
			WHERE d.run_id = $1 AND d.rank = c.rank AND d.block = c.block AND d.seq = c.seq`,
			runID, ranks, blocks, seqs); err != nil {
			return fmt.Errorf("clear markers: %w", err)
		}
		return bumpSummaryGen(ctx, tx, runID, n)
	})
	if err != nil {
		if ctx.Err() == nil && skipped(err) {
			s.log.Debug("rollup refresh left for later", "run_id", runID, "took", time.Since(start), "err", err)
			return 0, errRefreshSkipped
		}
		return 0, fmt.Errorf("store: refresh rollups of %s: %w", runID, err)
	}
	s.log.Debug("refreshed rollups", "run_id", runID, "blocks", n, "took", time.Since(start))
	return n, nil
}

// bucketKey names one rollup bucket of one rank (of a width known from
// context).
type bucketKey struct {
	rank   int32
	bucket int64
}

// compareKeys orders bucket keys by rank, then bucket: the order of the
// markers a chunk reads and of the rollups it writes.
func compareKeys(a, b bucketKey) int {
	return cmp.Or(cmp.Compare(a.rank, b.rank), cmp.Compare(a.bucket, b.bucket))
}

// spans turns sorted, distinct bucket keys into runs of consecutive
// buckets per rank, as parallel arrays for unnest: a cold refresh then
// reads its raw rows with one index range scan instead of one per block.
func spans(keys []bucketKey) (ranks []int32, los, his []int64) {
	for i, k := range keys {
		if i > 0 && k.rank == keys[i-1].rank && k.bucket == keys[i-1].bucket+1 {
			his[len(his)-1] = k.bucket
			continue
		}
		ranks = append(ranks, k.rank)
		los = append(los, k.bucket)
		his = append(his, k.bucket)
	}
	return ranks, los, his
}

// parentKeys returns the sorted, distinct buckets of width w*factor that
// cover keys of width w.
func parentKeys(keys []bucketKey, factor int64) []bucketKey {
	var out []bucketKey
	for _, k := range keys {
		p := bucketKey{k.rank, k.bucket / factor}
		if len(out) == 0 || out[len(out)-1] != p {
			out = append(out, p)
		}
	}
	return out
}

// rollupMetrics are the rolled-up metrics: the step metrics plus "step"
// itself (its count is the number of rows, its min and max the span) and
// "skipped" (its sum is the number of skipped steps).
var rollupMetrics = append([]string{"step", "skipped"}, StepMetrics...)

// metricAcc folds values with PostgreSQL's float semantics, so rollups
// read the same as aggregates over the raw rows: NaN sorts above every
// number (a NaN makes the max NaN, and the min only when every value is
// NaN) and makes the sum NaN.
type metricAcc struct {
	min, max, sum float64
	n             int64
}

func (a *metricAcc) add(v float64) {
	if a.n == 0 {
		a.min, a.max, a.sum, a.n = v, v, v, 1
		return
	}
	if pgLess(v, a.min) {
		a.min = v
	}
	if pgLess(a.max, v) {
		a.max = v
	}
	a.sum += v
	a.n++
}

// pgLess orders float8 as PostgreSQL does: NaN above +Inf.
func pgLess(a, b float64) bool {
	if math.IsNaN(a) {
		return false
	}
	return math.IsNaN(b) || a < b
}

// stepBucket accumulates the width-100 bucket of one rank.
type stepBucket struct {
	key       bucketKey
	firstStep int64
	firstTime int64 // microseconds since the PostgreSQL epoch
	lastTime  int64
	m         []metricAcc
}

// stepColumns selects what the metric rollups fold, in rollupMetrics
// order after rank and time; the integer counters travel as float8 so
// that every metric decodes alike.
var stepColumns = func() string {
	cols := []string{"s.rank", "s.time", "s.step", "s.skipped"}
	for _, m := range StepMetrics {
		if m == "samples" || m == "tokens" {
			cols = append(cols, "s."+m+"::float8")
		} else {
			cols = append(cols, "s."+m)
		}
	}
	return strings.Join(cols, ", ")
}()

// userMetricsSQL rolls up the user metrics (steps.metrics, a JSON object)
// of the width-100 buckets in the spans ($2 ranks, $3/$4 first and last
// block). A value counts when its text is a number, NaN or an infinity.
const userMetricsSQL = `
WITH d AS (SELECT * FROM unnest($2::int[], $3::bigint[], $4::bigint[]) AS d(rank, lo, hi)),
r AS (
	SELECT s.rank, s.step, s.time, s.metrics FROM d JOIN steps s
	ON s.run_id = $1 AND s.rank = d.rank AND s.step >= d.lo * 100 AND s.step < (d.hi + 1) * 100
	WHERE jsonb_typeof(s.metrics) = 'object'
)
INSERT INTO metric_rollup_rows (run_id, rank, width, bucket, metric, first_step, first_time, last_time, min, max, sum, count)
SELECT $1, rank, 100, bucket, metric, first_step, first_time, last_time, mn, mx, sm, n FROM (
	SELECT r.rank, r.step / 100 AS bucket, 'metrics.' || kv.key AS metric,
	       min(r.step) AS first_step, (array_agg(r.time ORDER BY r.step))[1] AS first_time, max(r.time) AS last_time,
	       min(v) AS mn, max(v) AS mx, sum(v) AS sm, count(v) AS n
	FROM r, jsonb_each_text(r.metrics) kv,
	     LATERAL (SELECT CASE WHEN kv.value ~* '^\s*[-+]?([0-9.]+([eE][-+]?[0-9]+)?|NaN|Infinity|inf)\s*$'
	                          THEN kv.value::float8 END AS v) x
	GROUP BY 1, 2, 3
) u WHERE n > 0`

// parentMetricsSQL recomputes the buckets of width $4 that cover the given
// buckets of width $5 = $4 / 10 from those finer rows of
// metric_rollup_rows (parentMetricSetsSQL does the same for the sets).
const parentMetricsSQL = `
WITH p AS (SELECT * FROM unnest($2::int[], $3::bigint[]) AS p(rank, bucket))
INSERT INTO metric_rollup_rows (run_id, rank, width, bucket, metric, first_step, first_time, last_time, min, max, sum, count)
SELECT $1, m.rank, $4, m.bucket * $5 / $4, m.metric, min(m.first_step),
       (array_agg(m.first_time ORDER BY m.first_step))[1], max(m.last_time), min(m.min), max(m.max), sum(m.sum ORDER BY m.bucket), sum(m.count)::bigint
FROM p JOIN metric_rollup_rows m
ON m.run_id = $1 AND m.rank = p.rank AND m.width = $5
   AND m.bucket >= p.bucket * $4 / $5 AND m.bucket < (p.bucket + 1) * $4 / $5
GROUP BY m.rank, m.metric, m.bucket * $5 / $4`

// clearRollups deletes the rollups of width in table (metric_rollup_rows,
// metric_rollup_sets or layer_rollups) whose buckets lie in the spans
// ranks, los, his of run, so that a refresh writes them afresh.
func clearRollups(ctx context.Context, tx pgx.Tx, table, runID string, ranks []int32, los, his []int64, width int64) error {
	if _, err := tx.Exec(ctx, `
		DELETE FROM `+table+` r USING unnest($2::int[], $3::bigint[], $4::bigint[]) AS d(rank, lo, hi)
		WHERE r.run_id = $1 AND r.rank = d.rank AND r.width = $5 AND r.bucket BETWEEN d.lo AND d.hi`,
		runID, ranks, los, his, width); err != nil {
		return fmt.Errorf("clear %s of width %d: %w", table, width, err)
	}
	return nil
}

// rollupTable is what the refresh of one rollup table (the metric rollups,
// in metric_rollup_rows and metric_rollup_sets, and layer_rollups) does on
// its own; refreshBlocks walks the widths for each, clearing every bucket
// it writes in each of its tables.
type rollupTable struct {
	names []string
	// raw writes the width-100 buckets in the spans ranks, los, his from
	// the raw rows.
	raw func(ctx context.Context, tx pgx.Tx, runID string, ranks []int32, los, his []int64) error
	// coarser writes the buckets parents (sorted, distinct) of width w
	// from the buckets of width cw below them.
	coarser func(ctx context.Context, tx pgx.Tx, runID string, parents []bucketKey, w, cw int64) error
}

// clear deletes the rollups of width in every table of t whose buckets lie
// in the spans ranks, los, his of run.
func (t rollupTable) clear(ctx context.Context, tx pgx.Tx, runID string, ranks []int32, los, his []int64, width int64) error {
	for _, name := range t.names {
		if err := clearRollups(ctx, tx, name, runID, ranks, los, his, width); err != nil {
			return err
		}
	}
	return nil
}

// refreshBlocks recomputes t's rollups of the width-100 buckets keys
// (sorted, distinct) and of the coarser buckets above them, the finer
// width first: each width's buckets are deleted, then written afresh.
func refreshBlocks(ctx context.Context, tx pgx.Tx, runID string, keys []bucketKey, t rollupTable) error {
	ranks, los, his := spans(keys)
	if err := t.clear(ctx, tx, runID, ranks, los, his, RollupWidths[0]); err != nil {
		return err
	}
	if err := t.raw(ctx, tx, runID, ranks, los, his); err != nil {
		return err
	}
	child := keys
	for i := 1; i < len(RollupWidths); i++ {
		w, cw := RollupWidths[i], RollupWidths[i-1]
		parents := parentKeys(child, w/cw)
		pr, pl, ph := spans(parents)
		if err := t.clear(ctx, tx, runID, pr, pl, ph, w); err != nil {
			return err
		}
		if err := t.coarser(ctx, tx, runID, parents, w, cw); err != nil {
			return err
		}
		child = parents
	}
	return nil
}

// refreshMetricBlocks recomputes the metric rollups of the width-100
// buckets keys (sorted, distinct) and of the coarser buckets above them,
// then the whole-run figures of their ranks.
func refreshMetricBlocks(ctx context.Context, tx pgx.Tx, runID string, keys []bucketKey) error {
	if err := refreshBlocks(ctx, tx, runID, keys, metricRollups); err != nil {
		return err
	}
	return refreshTotals(ctx, tx, runID, uniqueRanks(keys), nil)
}

var metricRollups = rollupTable{names: []string{"metric_rollup_rows", "metric_rollup_sets"}, raw: rawMetricRollups,
	coarser: coarserMetricRollups}

// rawMetricRollups writes the width-100 metric rollups of the spans. The
// built-in metrics are folded here from a binary stream of the raw rows,
// which is several times cheaper than 80 SQL aggregates per bucket.
func rawMetricRollups(ctx context.Context, tx pgx.Tx, runID string, ranks []int32, los, his []int64) error {
	rows, err := tx.Query(ctx, `
		SELECT `+stepColumns+`
		FROM unnest($2::int[], $3::bigint[], $4::bigint[]) AS d(rank, lo, hi) JOIN steps s
		ON s.run_id = $1 AND s.rank = d.rank AND s.step >= d.lo * 100 AND s.step < (d.hi + 1) * 100`,
		runID, ranks, los, his)
	if err != nil {
		return fmt.Errorf("read steps: %w", err)
	}
	buckets, err := foldSteps(rows)
	if err != nil {
		return fmt.Errorf("read steps: %w", err)
	}
	out := make([][]any, 0, len(buckets))
	for _, b := range buckets {
		if row := metricSet(runID, b.key.rank, b.key.bucket, stepSet, rollupMetrics, b.m, b.firstStep, b.firstTime, b.lastTime); row != nil {
			out = append(out, row)
		}
	}
	if err := copySets(ctx, tx, out); err != nil {
		return fmt.Errorf("write metric rollups: %w", err)
	}
	if _, err := tx.Exec(ctx, userMetricsSQL, runID, ranks, los, his); err != nil {
		return fmt.Errorf("compute user metric rollups: %w", err)
	}
	return nil
}

// coarserMetricRollups writes the metric rollups of width w of parents
// with parentMetricsSQL and parentMetricSetsSQL.
func coarserMetricRollups(ctx context.Context, tx pgx.Tx, runID string, parents []bucketKey, w, cw int64) error {
	pranks, pbuckets := make([]int32, len(parents)), make([]int64, len(parents))
	for j, p := range parents {
		pranks[j], pbuckets[j] = p.rank, p.bucket
	}
	for _, sql := range []string{parentMetricsSQL, parentMetricSetsSQL} {
		if _, err := tx.Exec(ctx, sql, runID, pranks, pbuckets, w, cw); err != nil {
			return fmt.Errorf("compute metric rollups of width %d: %w", w, err)
		}
	}
	return nil
}

// foldSteps folds rows of stepColumns into width-100 buckets, returned in
// (rank, bucket) order.
func foldSteps(rows pgx.Rows) ([]*stepBucket, error) {
	defer rows.Close()
	if err := requireBinary(rows); err != nil {
		return nil, err
	}
	byKey := map[bucketKey]*stepBucket{}
	var last *stepBucket
	for rows.Next() {
		v := rows.RawValues()
		rank, tm, step, err := rawRowHead(v)
		if err != nil {
			return nil, err
		}
		k := bucketKey{rank, step / 100}
		b := last
		if b == nil || b.key != k {
			b = byKey[k]
			if b == nil {
				b = &stepBucket{key: k, firstStep: step, firstTime: tm, lastTime: tm, m: make([]metricAcc, len(rollupMetrics))}
				byKey[k] = b
			}
			last = b
		}
		if step < b.firstStep {
			b.firstStep, b.firstTime = step, tm
		}
		b.lastTime = max(b.lastTime, tm)
		b.m[0].add(float64(step))
		if v[3] != nil {
			if len(v[3]) != 1 {
				return nil, fmt.Errorf("bool of %d bytes", len(v[3]))
			}
			b.m[1].add(float64(v[3][0]))
		}
		for i := 4; i < len(v); i++ {
			if v[i] == nil {
				continue
			}
			x, err := rawInt8(v[i])
			if err != nil {
				return nil, err
			}
			b.m[i-2].add(math.Float64frombits(uint64(x)))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make([]*stepBucket, 0, len(byKey))
	for _, b := range byKey {
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b *stepBucket) int { return compareKeys(a.key, b.key) })
	return out, nil
}
