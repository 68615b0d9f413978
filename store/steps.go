package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/detect"
)

// The steps table: one row per run, rank and step. This file holds its
// COPY row and merge statement (steps_inline.go: the insert of a small
// batch in the first round trip), the series reads and the detectors'
// reads; steps_timings.go the timing reads, rollups.go the rollups.

// RecentSteps reads each rank's newest n steps, by rank and newest first.
// Each rank's rows come from a backward scan of the steps' unique index: a
// bounded read however long the run.
func (s *Store) RecentSteps(ctx context.Context, runID string, ranks []int, n int) ([]detect.StepRow, error) {
	return s.RecentStepsFrom(ctx, runID, ranks, n, math.MinInt64)
}

// RecentStepsFrom is RecentSteps of the steps with step >= from.
func (s *Store) RecentStepsFrom(ctx context.Context, runID string, ranks []int, n int, from int64) ([]detect.StepRow, error) {
	rk := make([]int32, len(ranks))
	for i, r := range ranks {
		rk[i] = int32(r)
	}
	rows, err := s.pool.Query(ctx, `
		SELECT rk.rank, x.step, x.time, x.loss, x.grad_norm, x.loss_scale, coalesce(x.skipped, false), x.step_ms, x.data_ms,
			x.sync_ns, x.sync_wait_ms, x.forward_ms, x.backward_ms, x.optimizer_ms, x.comm_exposed_ms, x.input_wait_ms
		FROM unnest($3::int[]) AS rk(rank), LATERAL (SELECT step, time, loss, grad_norm, loss_scale, skipped, step_ms, data_ms,
			sync_ns, sync_wait_ms, forward_ms, backward_ms, optimizer_ms, comm_exposed_ms, input_wait_ms FROM steps
			WHERE run_id = $1 AND rank = rk.rank AND step >= $4 ORDER BY step DESC, time DESC LIMIT $2) x
		ORDER BY rk.rank, x.step DESC`, runID, n, rk, from)
	if err != nil {
		return nil, fmt.Errorf("store: recent steps of %s: %w", runID, err)
	}
	defer rows.Close()
	var out []detect.StepRow
	for rows.Next() {
		var s detect.StepRow
		if err := rows.Scan(&s.Rank, &s.Step, &s.Time, &s.Loss, &s.GradNorm, &s.LossScale, &s.Skipped, &s.StepMS, &s.DataMS,
			&s.SyncNS, &s.SyncWaitMS, &s.ForwardMS, &s.BackwardMS, &s.OptimizerMS, &s.CommExposedMS, &s.InputWaitMS); err != nil {
			return nil, fmt.Errorf("store: recent steps of %s: %w", runID, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: recent steps of %s: %w", runID, err)
	}
	return out, nil
}

// SyncSteps reads every rank's steps in [from, to] with the fields the
// straggler score needs (Step, Time, StepMS, SyncNS, SyncWaitMS), by rank
// and newest first. It reads every rank's rows of the range: the caller
// bounds ranks × steps.
func (s *Store) SyncSteps(ctx context.Context, runID string, ranks []int, from, to int64) ([]detect.StepRow, error) {
	rk := make([]int32, len(ranks))
	for i, r := range ranks {
		rk[i] = int32(r)
	}
	rows, err := s.pool.Query(ctx, `
		SELECT rk.rank, x.step, x.time, x.step_ms, x.sync_ns, x.sync_wait_ms
		FROM unnest($4::int[]) AS rk(rank), LATERAL (SELECT step, time, step_ms, sync_ns, sync_wait_ms FROM steps
			WHERE run_id = $1 AND rank = rk.rank AND step >= $2 AND step <= $3 ORDER BY step DESC, time DESC) x
		ORDER BY rk.rank, x.step DESC`, runID, from, to, rk)
	if err != nil {
		return nil, fmt.Errorf("store: sync steps of %s: %w", runID, err)
	}
	defer rows.Close()
	var out []detect.StepRow
	for rows.Next() {
		var s detect.StepRow
		if err := rows.Scan(&s.Rank, &s.Step, &s.Time, &s.StepMS, &s.SyncNS, &s.SyncWaitMS); err != nil {
			return nil, fmt.Errorf("store: sync steps of %s: %w", runID, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: sync steps of %s: %w", runID, err)
	}
	return out, nil
}

// StepNear returns the first recorded step of the run's rank at or after s
// (after true), or the last one at or before s, with its time; found is
// false when there is none.
func (s *Store) StepNear(ctx context.Context, runID string, rank int, step int64, after bool) (at int64, t time.Time, found bool, err error) {
	sql := `SELECT step, time FROM steps WHERE run_id = $1 AND rank = $2 AND step >= $3 ORDER BY step LIMIT 1`
	if !after {
		sql = `SELECT step, time FROM steps WHERE run_id = $1 AND rank = $2 AND step <= $3 ORDER BY step DESC LIMIT 1`
	}
	err = s.pool.QueryRow(ctx, sql, runID, rank, step).Scan(&at, &t)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, time.Time{}, false, nil
	}
	if err != nil {
		return 0, time.Time{}, false, fmt.Errorf("store: step near %d of %s rank %d: %w", step, runID, rank, err)
	}
	return at, t, true, nil
}

// StepCopies returns how many rows each step of the run has, counted per
// rank and step; a step several ranks hold shows one rank's count. Load
// tools use it to check that what was acknowledged is stored once.
func (s *Store) StepCopies(ctx context.Context, runID string) (map[int64]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT step, count(*) FROM steps WHERE run_id = $1 GROUP BY rank, step`, runID)
	if err != nil {
		return nil, fmt.Errorf("store: step copies of %s: %w", runID, err)
	}
	defer rows.Close()
	out := map[int64]int{}
	for rows.Next() {
		var step int64
		var n int
		if err := rows.Scan(&step, &n); err != nil {
			return nil, fmt.Errorf("store: step copies of %s: %w", runID, err)
		}
		out[step] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: step copies of %s: %w", runID, err)
	}
	return out, nil
}

// CountStepRows counts the run's rows in steps (layers false) or in
// layer_times (layers true), and how many of them repeat a (rank, step)
// key: the rows beyond the first of each key. Load tools use it.
func (s *Store) CountStepRows(ctx context.Context, runID string, layers bool) (rows, repeated int64, err error) {
	q := `SELECT count(*), count(*) - count(DISTINCT (rank, step)) FROM steps WHERE run_id = $1`
	if layers {
		q = `SELECT count(*), count(*) - count(DISTINCT (rank, step)) FROM layer_times WHERE run_id = $1`
	}
	if err := s.pool.QueryRow(ctx, q, runID).Scan(&rows, &repeated); err != nil {
		return 0, 0, fmt.Errorf("store: count rows of %s: %w", runID, err)
	}
	return rows, repeated, nil
}

// stepCols are the columns a step row is written to: its key, the step
// table's values (api.StepFields) in its order, and the user metrics.
var stepCols = func() []string {
	cols := []string{"run_id", "rank", "step", "time"}
	for _, sf := range api.StepFields {
		cols = append(cols, sf.Name)
	}
	return append(cols, "metrics")
}()

func (b *batchPlan) stepRow(i int, r []any) []any {
	s := b.steps[i]
	r = append(r, s.RunID, int32(s.Rank), *s.Step, s.Time.Time)
	for _, sf := range api.StepFields {
		switch p := sf.Field(s).(type) {
		case **api.Float:
			r = append(r, f(*p))
		case **int64:
			r = append(r, optInt(*p))
		case **bool:
			var v any
			if *p != nil {
				v = **p
			}
			r = append(r, v)
		}
	}
	return append(r, jsonValue(s.Metrics, len(s.Metrics) == 0))
}

// mergeSteps is the merge of steps (mergeNewest), keyed by run, rank and
// step; every block it writes into gets its rollup marker.
var mergeSteps = mergeNewest("steps", "rank", true)

// RawPoint is one step's value of one metric.
type RawPoint struct {
	Step  int64
	Time  time.Time
	Value float64
}

// metricExpr returns the SQL expression reading metric from a steps row,
// or an error when the name is not a known metric.
func metricExpr(metric string) (string, error) {
	if name, ok := strings.CutPrefix(metric, "metrics."); ok {
		if name == "" {
			return "", fmt.Errorf("empty user metric name")
		}
		// The name travels as a bound parameter; see SeriesRaw.
		return `CASE WHEN (metrics->>$5) ~* '^\s*[-+]?([0-9.]+([eE][-+]?[0-9]+)?|NaN|Infinity|inf)\s*$' THEN (metrics->>$5)::float8 END`, nil
	}
	if metric == "skipped" {
		return "skipped::int::float8", nil
	}
	if metric == "step" || IsStepMetric(metric) {
		return metric + "::float8", nil
	}
	return "", fmt.Errorf("unknown metric %q", metric)
}

// SeriesRaw returns the raw values of metric for one rank over
// [from, to], in step order, skipping rows without the metric.
func (s *Store) SeriesRaw(ctx context.Context, runID string, rank int, metric string, from, to int64) ([]RawPoint, error) {
	expr, err := metricExpr(metric)
	if err != nil {
		return nil, err
	}
	user, _ := strings.CutPrefix(metric, "metrics.")
	q := `SELECT step, time, v FROM (SELECT step, time, ` + expr + ` AS v FROM steps
		WHERE run_id = $1 AND rank = $2 AND step >= $3 AND step <= $4) x WHERE v IS NOT NULL ORDER BY step`
	args := []any{runID, rank, from, to}
	if strings.HasPrefix(metric, "metrics.") {
		args = append(args, user)
	} else {
		q = strings.Replace(q, "$5", "''", -1)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: read %s of %s: %w", metric, runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RawPoint, error) {
		var p RawPoint
		err := r.Scan(&p.Step, &p.Time, &p.Value)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: read %s of %s: %w", metric, runID, err)
	}
	return out, nil
}

// RollupRow is one rollup bucket of one metric.
type RollupRow struct {
	Bucket    int64
	FirstStep int64
	FirstTime time.Time
	Min, Max  float64
	Sum       float64
	Count     int64
}

// MetricRollups returns the buckets of width w of one metric and rank
// whose index lies in [fromBucket, toBucket], in order.
func (s *Store) MetricRollups(ctx context.Context, runID string, rank int, metric string, w, fromBucket, toBucket int64) ([]RollupRow, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT bucket, first_step, first_time, coalesce(min, 'NaN'), coalesce(max, 'NaN'), coalesce(sum, 'NaN'), count
		FROM metric_rollups
		WHERE run_id = $1 AND rank = $2 AND metric = $3 AND width = $4 AND bucket >= $5 AND bucket <= $6
		ORDER BY bucket`, runID, rank, metric, w, fromBucket, toBucket)
	if err != nil {
		return nil, fmt.Errorf("store: read %s rollups of %s: %w", metric, runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RollupRow, error) {
		var p RollupRow
		err := r.Scan(&p.Bucket, &p.FirstStep, &p.FirstTime, &p.Min, &p.Max, &p.Sum, &p.Count)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: read %s rollups of %s: %w", metric, runID, err)
	}
	return out, nil
}

// StepSpan returns the first and last step of a rank.
func (s *Store) StepSpan(ctx context.Context, runID string, rank int) (first, last int64, ok bool, err error) {
	return s.span(ctx, "steps", runID, rank)
}

// span returns the first and last step of a rank in table (steps or
// layer_times), each read from the end of its unique index.
func (s *Store) span(ctx context.Context, table, runID string, rank int) (first, last int64, ok bool, err error) {
	var f, l *int64
	err = s.pool.QueryRow(ctx, `SELECT
		(SELECT step FROM `+table+` WHERE run_id = $1 AND rank = $2 ORDER BY step LIMIT 1),
		(SELECT step FROM `+table+` WHERE run_id = $1 AND rank = $2 ORDER BY step DESC LIMIT 1)`, runID, rank).Scan(&f, &l)
	if err != nil {
		return 0, 0, false, fmt.Errorf("store: %s span of %s: %w", table, runID, err)
	}
	if f == nil || l == nil {
		return 0, 0, false, nil
	}
	return *f, *l, true, nil
}

// MaxStepValue is past every step a run can record.
const MaxStepValue = int64(1) << 53

// StepBuckets returns every rank's values of a step metric over the steps
// in [from, to], bucketed by width steps (one row a rank and bucket, in
// rank and step order): the raw read behind a distribution over the ranks
// of a run too short for the rollups' buckets of 100 steps. The caller
// bounds ranks × steps.
func (s *Store) StepBuckets(ctx context.Context, runID, metric string, from, to, width int64) ([]RankBucket, error) {
	if width < 1 {
		return nil, fmt.Errorf("store: %s of %s by rank: bucket width %d", metric, runID, width)
	}
	expr, err := metricExpr(metric)
	if err != nil {
		return nil, err
	}
	q := `SELECT rank, min(step), (array_agg(time ORDER BY step))[1], min(v), max(v), sum(v), count(*) FROM (
			SELECT rank, step, time, ` + expr + ` AS v FROM steps WHERE run_id = $1 AND step >= $2 AND step <= $3
		) x WHERE v IS NOT NULL GROUP BY rank, step / $4 ORDER BY rank, 2`
	args := []any{runID, from, to, width}
	if user, ok := strings.CutPrefix(metric, "metrics."); ok {
		args = append(args, user)
	} else {
		q = strings.ReplaceAll(q, "$5", "''")
	}
	return s.rankBuckets(ctx, metric+" by rank", runID, q, args...)
}
