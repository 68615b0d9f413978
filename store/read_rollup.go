package store

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
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
	"gpu_mem_peak_gb", "gpu_mem_reserved_gb", "cpu_util_pct", "tflops", "mfu",
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
// keeps ingest waiting on the markers it deletes. 500 blocks is 50,000
// steps per rank: a few hundred milliseconds of work.
const refreshChunk = 500

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
	var dirty bool
	if err := s.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM rollup_dirty WHERE run_id = $1)`, runID).Scan(&dirty); err != nil {
		return 0, false, fmt.Errorf("store: check rollup markers: %w", err)
	}
	if !dirty {
		return 0, false, nil
	}
	for {
		c, err := s.refreshChunk(ctx, runID)
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
	rows, err := s.Pool.Query(ctx, `
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

func (s *Store) refreshChunk(ctx context.Context, runID string) (int, error) {
	start := time.Now()
	n := 0
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('rollup:' || $1, 0))`, runID); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		// The markers are read without locking them, so ingest never waits
		// for a refresh. Every write into a block bumps its marker's seq
		// (or creates the marker) in the write's own transaction; the
		// markers are deleted at the end only where seq is still the one
		// read here. A write committed before the read is seen by every
		// statement below; one committed later leaves its marker behind
		// for the next refresh.
		rows, err := tx.Query(ctx, `
			SELECT rank, block, seq FROM rollup_dirty WHERE run_id = $1
			ORDER BY rank, block LIMIT $2`, runID, refreshChunk)
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
		if err := refreshLayerBlocks(ctx, tx, runID, keys); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `
			DELETE FROM rollup_dirty d
			USING unnest($2::int[], $3::bigint[], $4::bigint[]) AS c(rank, block, seq)
			WHERE d.run_id = $1 AND d.rank = c.rank AND d.block = c.block AND d.seq = c.seq`,
			runID, ranks, blocks, seqs); err != nil {
			return fmt.Errorf("clear markers: %w", err)
		}
		return nil
	})
	if err != nil {
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

func sortKeys(keys []bucketKey) {
	slices.SortFunc(keys, func(a, b bucketKey) int {
		if c := cmp.Compare(a.rank, b.rank); c != 0 {
			return c
		}
		return cmp.Compare(a.bucket, b.bucket)
	})
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
INSERT INTO metric_rollups (run_id, rank, width, bucket, metric, first_step, first_time, min, max, sum, count)
SELECT $1, rank, 100, bucket, metric, first_step, first_time, mn, mx, sm, n FROM (
	SELECT r.rank, r.step / 100 AS bucket, 'metrics.' || kv.key AS metric,
	       min(r.step) AS first_step, (array_agg(r.time ORDER BY r.step))[1] AS first_time,
	       min(v) AS mn, max(v) AS mx, sum(v) AS sm, count(v) AS n
	FROM r, jsonb_each_text(r.metrics) kv,
	     LATERAL (SELECT CASE WHEN kv.value ~* '^\s*[-+]?([0-9.]+([eE][-+]?[0-9]+)?|NaN|Infinity|inf)\s*$'
	                          THEN kv.value::float8 END AS v) x
	GROUP BY 1, 2, 3
) u WHERE n > 0`

// parentMetricsSQL recomputes the buckets of width $4 that cover the given
// buckets of width $5 = $4 / 10 from those finer rows.
const parentMetricsSQL = `
WITH p AS (SELECT * FROM unnest($2::int[], $3::bigint[]) AS p(rank, bucket))
INSERT INTO metric_rollups (run_id, rank, width, bucket, metric, first_step, first_time, min, max, sum, count)
SELECT $1, m.rank, $4, m.bucket * $5 / $4, m.metric, min(m.first_step),
       (array_agg(m.first_time ORDER BY m.first_step))[1], min(m.min), max(m.max), sum(m.sum), sum(m.count)::bigint
FROM p JOIN metric_rollups m
ON m.run_id = $1 AND m.rank = p.rank AND m.width = $5
   AND m.bucket >= p.bucket * $4 / $5 AND m.bucket < (p.bucket + 1) * $4 / $5
GROUP BY m.rank, m.metric, m.bucket * $5 / $4`

// clearRollups deletes the rollups of width in table (metric_rollups or
// layer_rollups) whose buckets lie in the spans ranks, los, his of run, so
// that a refresh writes them afresh.
func clearRollups(ctx context.Context, tx pgx.Tx, table, runID string, ranks []int32, los, his []int64, width int64) error {
	if _, err := tx.Exec(ctx, `
		DELETE FROM `+table+` r USING unnest($2::int[], $3::bigint[], $4::bigint[]) AS d(rank, lo, hi)
		WHERE r.run_id = $1 AND r.rank = d.rank AND r.width = $5 AND r.bucket BETWEEN d.lo AND d.hi`,
		runID, ranks, los, his, width); err != nil {
		return fmt.Errorf("clear %s of width %d: %w", table, width, err)
	}
	return nil
}

// refreshMetricBlocks recomputes the metric rollups of the width-100
// buckets keys (sorted, distinct) and of the coarser buckets above them.
// The built-in metrics are folded here from a binary stream of the raw
// rows, which is several times cheaper than 80 SQL aggregates per bucket.
func refreshMetricBlocks(ctx context.Context, tx pgx.Tx, runID string, keys []bucketKey) error {
	ranks, los, his := spans(keys)
	if err := clearRollups(ctx, tx, "metric_rollups", runID, ranks, los, his, 100); err != nil {
		return err
	}
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
	out := make([][]any, 0, len(buckets)*len(rollupMetrics))
	for _, b := range buckets {
		ft := pgTime(b.firstTime)
		for i, a := range b.m {
			if a.n > 0 {
				out = append(out, []any{runID, b.key.rank, int32(100), b.key.bucket, rollupMetrics[i],
					b.firstStep, ft, a.min, a.max, a.sum, a.n})
			}
		}
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"metric_rollups"},
		[]string{"run_id", "rank", "width", "bucket", "metric", "first_step", "first_time", "min", "max", "sum", "count"},
		pgx.CopyFromRows(out)); err != nil {
		return fmt.Errorf("write metric rollups: %w", err)
	}
	if _, err := tx.Exec(ctx, userMetricsSQL, runID, ranks, los, his); err != nil {
		return fmt.Errorf("compute user metric rollups: %w", err)
	}
	child := keys
	for i := 1; i < len(RollupWidths); i++ {
		w, cw := RollupWidths[i], RollupWidths[i-1]
		parents := parentKeys(child, w/cw)
		pr, pl, ph := spans(parents)
		if err := clearRollups(ctx, tx, "metric_rollups", runID, pr, pl, ph, w); err != nil {
			return err
		}
		pranks, pbuckets := make([]int32, len(parents)), make([]int64, len(parents))
		for j, p := range parents {
			pranks[j], pbuckets[j] = p.rank, p.bucket
		}
		if _, err := tx.Exec(ctx, parentMetricsSQL, runID, pranks, pbuckets, w, cw); err != nil {
			return fmt.Errorf("compute metric rollups of width %d: %w", w, err)
		}
		child = parents
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
				b = &stepBucket{key: k, firstStep: step, firstTime: tm, m: make([]metricAcc, len(rollupMetrics))}
				byKey[k] = b
			}
			last = b
		}
		if step < b.firstStep {
			b.firstStep, b.firstTime = step, tm
		}
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
	slices.SortFunc(out, func(a, b *stepBucket) int {
		if c := cmp.Compare(a.key.rank, b.key.rank); c != 0 {
			return c
		}
		return cmp.Compare(a.key.bucket, b.key.bucket)
	})
	return out, nil
}

// layerBucket accumulates one layer rollup bucket: per-layer sums and
// counts of non-NULL values, aligned with runs.layer_names.
type layerBucket struct {
	key                  bucketKey
	firstStep            int64
	firstTime            int64 // microseconds since the PostgreSQL epoch
	rows                 int64
	fwdSums, bwdSums     []float64
	fwdCounts, bwdCounts []int64
}

func (b *layerBucket) row(runID string, w int64) []any {
	// A NULL array would break NOT NULL; a bucket without values is '{}'.
	nz := func(f []float64, c []int64) ([]float64, []int64) {
		if f == nil {
			return []float64{}, []int64{}
		}
		return f, c
	}
	fs, fc := nz(b.fwdSums, b.fwdCounts)
	bs, bc := nz(b.bwdSums, b.bwdCounts)
	return []any{runID, b.key.rank, int32(w), b.key.bucket, b.firstStep, pgTime(b.firstTime), b.rows, fs, fc, bs, bc}
}

var layerRollupColumns = []string{"run_id", "rank", "width", "bucket", "first_step", "first_time", "rows",
	"fwd_sums", "fwd_counts", "bwd_sums", "bwd_counts"}

// refreshLayerBlocks recomputes the layer rollups of the width-100 buckets
// keys (sorted, distinct) and of the coarser buckets above them. The raw
// arrays are streamed in binary and summed in Go without decoding them
// into values of their own: a 1,000,000-step, 100-layer run is 100M
// elements, which SQL's unnest and GROUP BY take many minutes to sum.
func refreshLayerBlocks(ctx context.Context, tx pgx.Tx, runID string, keys []bucketKey) error {
	ranks, los, his := spans(keys)
	if err := clearRollups(ctx, tx, "layer_rollups", runID, ranks, los, his, 100); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `
		SELECT l.rank, l.time, l.step, l.forward_ms, l.backward_ms
		FROM unnest($2::int[], $3::bigint[], $4::bigint[]) AS d(rank, lo, hi) JOIN layer_times l
		ON l.run_id = $1 AND l.rank = d.rank AND l.step >= d.lo * 100 AND l.step < (d.hi + 1) * 100`,
		runID, ranks, los, his)
	if err != nil {
		return fmt.Errorf("read layer times: %w", err)
	}
	buckets, err := foldLayers(rows)
	if err != nil {
		return fmt.Errorf("read layer times: %w", err)
	}
	if err := copyLayerRollups(ctx, tx, runID, 100, buckets); err != nil {
		return err
	}
	child := keys
	for i := 1; i < len(RollupWidths); i++ {
		w, cw := RollupWidths[i], RollupWidths[i-1]
		parents := parentKeys(child, w/cw)
		pr, pl, ph := spans(parents)
		if err := clearRollups(ctx, tx, "layer_rollups", runID, pr, pl, ph, w); err != nil {
			return err
		}
		f := w / cw
		rows, err := tx.Query(ctx, `
			SELECT l.rank, l.bucket, l.first_step, l.first_time, l.rows, l.fwd_sums, l.fwd_counts, l.bwd_sums, l.bwd_counts
			FROM unnest($2::int[], $3::bigint[], $4::bigint[]) AS d(rank, lo, hi) JOIN layer_rollups l
			ON l.run_id = $1 AND l.rank = d.rank AND l.width = $5 AND l.bucket >= d.lo * $6 AND l.bucket < (d.hi + 1) * $6`,
			runID, pr, pl, ph, cw, f)
		if err != nil {
			return fmt.Errorf("read layer rollups of width %d: %w", cw, err)
		}
		buckets, err := foldLayerRollups(rows, f)
		if err != nil {
			return fmt.Errorf("read layer rollups of width %d: %w", cw, err)
		}
		if err := copyLayerRollups(ctx, tx, runID, w, buckets); err != nil {
			return err
		}
		child = parents
	}
	return nil
}

func copyLayerRollups(ctx context.Context, tx pgx.Tx, runID string, w int64, buckets []*layerBucket) error {
	out := make([][]any, len(buckets))
	for i, b := range buckets {
		out[i] = b.row(runID, w)
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"layer_rollups"}, layerRollupColumns, pgx.CopyFromRows(out)); err != nil {
		return fmt.Errorf("write layer rollups of width %d: %w", w, err)
	}
	return nil
}

// layerFolder finds the bucket of each row, remembering the last one:
// rows arrive mostly in step order.
type layerFolder struct {
	byKey map[bucketKey]*layerBucket
	last  *layerBucket
}

func (f *layerFolder) bucket(k bucketKey, step, tm int64) *layerBucket {
	b := f.last
	if b == nil || b.key != k {
		b = f.byKey[k]
		if b == nil {
			b = &layerBucket{key: k, firstStep: step, firstTime: tm}
			f.byKey[k] = b
		}
		f.last = b
	}
	if step < b.firstStep {
		b.firstStep, b.firstTime = step, tm
	}
	return b
}

func (f *layerFolder) sorted() []*layerBucket {
	out := make([]*layerBucket, 0, len(f.byKey))
	for _, b := range f.byKey {
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b *layerBucket) int {
		if c := cmp.Compare(a.key.rank, b.key.rank); c != 0 {
			return c
		}
		return cmp.Compare(a.key.bucket, b.key.bucket)
	})
	return out
}

// foldLayers folds raw layer_times rows (rank, time, step, forward_ms,
// backward_ms) into width-100 buckets.
func foldLayers(rows pgx.Rows) ([]*layerBucket, error) {
	defer rows.Close()
	if err := requireBinary(rows); err != nil {
		return nil, err
	}
	f := layerFolder{byKey: map[bucketKey]*layerBucket{}}
	for rows.Next() {
		v := rows.RawValues()
		rank, tm, step, err := rawRowHead(v)
		if err != nil {
			return nil, err
		}
		b := f.bucket(bucketKey{rank, step / 100}, step, tm)
		b.rows++
		if b.fwdSums, b.fwdCounts, err = addFloat8Array(v[3], b.fwdSums, b.fwdCounts); err != nil {
			return nil, fmt.Errorf("forward_ms of step %d: %w", step, err)
		}
		if b.bwdSums, b.bwdCounts, err = addFloat8Array(v[4], b.bwdSums, b.bwdCounts); err != nil {
			return nil, fmt.Errorf("backward_ms of step %d: %w", step, err)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return f.sorted(), nil
}

// foldLayerRollups folds layer rollup rows of one width into the buckets
// factor times wider.
func foldLayerRollups(rows pgx.Rows, factor int64) ([]*layerBucket, error) {
	defer rows.Close()
	f := layerFolder{byKey: map[bucketKey]*layerBucket{}}
	for rows.Next() {
		var (
			k          bucketKey
			step, n    int64
			tm         time.Time
			fs, bs     []float64
			fc, bc     []int64
			firstMicro int64
		)
		if err := rows.Scan(&k.rank, &k.bucket, &step, &tm, &n, &fs, &fc, &bs, &bc); err != nil {
			return nil, err
		}
		firstMicro = tm.Sub(pgEpoch).Microseconds()
		k.bucket /= factor
		b := f.bucket(k, step, firstMicro)
		b.rows += n
		b.fwdSums, b.fwdCounts = addSums(b.fwdSums, b.fwdCounts, fs, fc)
		b.bwdSums, b.bwdCounts = addSums(b.bwdSums, b.bwdCounts, bs, bc)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return f.sorted(), nil
}

func addSums(sums []float64, counts []int64, s []float64, c []int64) ([]float64, []int64) {
	sums, counts = grow(sums, counts, max(len(s), len(c)))
	for i, v := range s {
		sums[i] += v
	}
	for i, v := range c {
		counts[i] += v
	}
	return sums, counts
}

func grow(sums []float64, counts []int64, n int) ([]float64, []int64) {
	for len(sums) < n {
		sums = append(sums, 0)
	}
	for len(counts) < n {
		counts = append(counts, 0)
	}
	return sums, counts
}

// addFloat8Array adds the non-NULL elements of a float8[] value in
// PostgreSQL's binary format to sums and counts, element i to index i,
// growing them to the array's length. A NULL array adds nothing.
//
// The format: int32 number of dimensions, int32 has-nulls flag, uint32
// element type, then per dimension int32 length and lower bound, then per
// element an int32 byte length (-1 for NULL) and the value.
func addFloat8Array(src []byte, sums []float64, counts []int64) ([]float64, []int64, error) {
	if src == nil {
		return sums, counts, nil
	}
	if len(src) < 12 {
		return nil, nil, fmt.Errorf("array of %d bytes", len(src))
	}
	ndim := int32(binary.BigEndian.Uint32(src))
	if ndim == 0 {
		return sums, counts, nil
	}
	if ndim != 1 || len(src) < 20 {
		return nil, nil, fmt.Errorf("array of %d dimensions", ndim)
	}
	if oid := binary.BigEndian.Uint32(src[8:]); oid != pgtype.Float8OID {
		return nil, nil, fmt.Errorf("array of type %d, want float8", oid)
	}
	n := int(int32(binary.BigEndian.Uint32(src[12:])))
	sums, counts = grow(sums, counts, n)
	p := src[20:]
	for i := 0; i < n; i++ {
		if len(p) < 4 {
			return nil, nil, fmt.Errorf("array truncated at element %d", i)
		}
		l := int32(binary.BigEndian.Uint32(p))
		p = p[4:]
		if l < 0 {
			continue
		}
		if l != 8 || len(p) < 8 {
			return nil, nil, fmt.Errorf("array element %d of %d bytes", i, l)
		}
		sums[i] += math.Float64frombits(binary.BigEndian.Uint64(p))
		counts[i]++
		p = p[8:]
	}
	return sums, counts, nil
}

// requireBinary checks that every column of rows travels in binary, as
// the raw decoders here expect; pgx asks for binary for every type they
// read.
// rawRowHead decodes the rank, time and step that lead every raw row a
// refresh reads, in binary format.
func rawRowHead(v [][]byte) (rank int32, tm, step int64, err error) {
	if rank, err = rawInt4(v[0]); err != nil {
		return 0, 0, 0, err
	}
	if tm, err = rawInt8(v[1]); err != nil {
		return 0, 0, 0, err
	}
	step, err = rawInt8(v[2])
	return rank, tm, step, err
}

func requireBinary(rows pgx.Rows) error {
	for _, fd := range rows.FieldDescriptions() {
		if fd.Format != pgtype.BinaryFormatCode {
			return fmt.Errorf("column %s arrives as text", fd.Name)
		}
	}
	return nil
}

func rawInt4(b []byte) (int32, error) {
	if len(b) != 4 {
		return 0, fmt.Errorf("int4 of %d bytes", len(b))
	}
	return int32(binary.BigEndian.Uint32(b)), nil
}

// rawInt8 decodes an int8, a float8's bits or a timestamptz's microseconds.
func rawInt8(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("8-byte value of %d bytes", len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

// pgEpoch is where PostgreSQL's binary timestamps count from.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func pgTime(micros int64) time.Time {
	return pgEpoch.Add(time.Duration(micros) * time.Microsecond)
}
