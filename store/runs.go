package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNotFound is returned by reads of a run that does not exist.
var ErrNotFound = errors.New("not found")

// RunRow is a runs row.
type RunRow struct {
	RunID      string
	Project    string
	Name       string
	Status     string
	StartedAt  *time.Time
	EndedAt    *time.Time
	LastSeenAt *time.Time
	Config     json.RawMessage
	Meta       json.RawMessage
	Params     json.RawMessage
	Summary    json.RawMessage
	Tags       []string
	SweepID    string
	LayerNames []string
}

const runCols = `run_id, project, name, status, started_at, ended_at, last_seen_at, config, meta, params, summary, tags, sweep_id, layer_names`

func scanRun(row pgx.Row) (*RunRow, error) {
	var r RunRow
	var cfg, meta, params, summary []byte
	err := row.Scan(&r.RunID, &r.Project, &r.Name, &r.Status, &r.StartedAt, &r.EndedAt, &r.LastSeenAt,
		&cfg, &meta, &params, &summary, &r.Tags, &r.SweepID, &r.LayerNames)
	if err != nil {
		return nil, err
	}
	r.Config, r.Meta, r.Params, r.Summary = cfg, meta, params, summary
	return &r, nil
}

// RunFilter selects runs for ListRuns. Empty fields match everything.
type RunFilter struct {
	Project, Status, Tag, Sweep string
	RunIDs                      []string
	Limit, Offset               int
}

// ListRuns returns the runs matching f, newest first, and how many match
// in all.
func (s *Store) ListRuns(ctx context.Context, f RunFilter) ([]*RunRow, int, error) {
	var where []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(cond, len(args)))
	}
	if f.Project != "" {
		add("project = $%d", f.Project)
	}
	if f.Status != "" {
		add("status = $%d", f.Status)
	}
	if f.Tag != "" {
		add("tags @> ARRAY[$%d::text]", f.Tag)
	}
	if f.Sweep != "" {
		add("sweep_id = $%d", f.Sweep)
	}
	if len(f.RunIDs) > 0 {
		add("run_id = ANY($%d)", f.RunIDs)
	}
	cond := ""
	if len(where) > 0 {
		cond = "WHERE " + strings.Join(where, " AND ")
	}
	var total int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM runs `+cond, args...).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("store: count runs: %w", err)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 1 << 30
	}
	args = append(args, limit, f.Offset)
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT %s FROM runs %s
		ORDER BY coalesce(started_at, created_at) DESC, run_id LIMIT $%d OFFSET $%d`, runCols, cond, len(args)-1, len(args)), args...)
	if err != nil {
		return nil, 0, fmt.Errorf("store: list runs: %w", err)
	}
	defer rows.Close()
	var out []*RunRow
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, 0, fmt.Errorf("store: list runs: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("store: list runs: %w", err)
	}
	return out, total, nil
}

// GetRun returns one run, or ErrNotFound.
func (s *Store) GetRun(ctx context.Context, runID string) (*RunRow, error) {
	r, err := scanRun(s.pool.QueryRow(ctx, `SELECT `+runCols+` FROM runs WHERE run_id = $1`, runID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: get run %s: %w", runID, err)
	}
	return r, nil
}

// RunCode returns the code sent with a run (the JSON of [api.RunCode]),
// nil when none was, or ErrNotFound when there is no such run.
func (s *Store) RunCode(ctx context.Context, runID string) (json.RawMessage, error) {
	var code []byte
	err := s.pool.QueryRow(ctx, `SELECT code FROM runs WHERE run_id = $1`, runID).Scan(&code)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: code of run %s: %w", runID, err)
	}
	return code, nil
}

// RunRanks returns the ranks that recorded steps or layers, ascending.
// It skips through the indexes of the rollups and of the markers of rows
// not rolled up yet, which are small, plain tables: a rank's rows are
// marked in the transaction that writes them and rolled up from the
// markers, so every rank with rows is in one or the other. The steps
// themselves, compressed on TimescaleDB, are not read.
func (s *Store) RunRanks(ctx context.Context, runID string) ([]int, error) {
	return runRanks(ctx, s.pool, runID)
}

// runRanks is [Store.RunRanks] on q (the pool, or a transaction).
func runRanks(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, runID string) ([]int, error) {
	skip := func(name, table string) string {
		return name + ` AS (
			(SELECT rank FROM ` + table + ` WHERE run_id = $1 ORDER BY rank LIMIT 1)
			UNION ALL
			SELECT (SELECT t.rank FROM ` + table + ` t WHERE t.run_id = $1 AND t.rank > ` + name + `.rank ORDER BY t.rank LIMIT 1)
			FROM ` + name + ` WHERE ` + name + `.rank IS NOT NULL
		)`
	}
	rows, err := q.Query(ctx, `WITH RECURSIVE `+skip("m", "metric_rollups")+`, `+skip("l", "layer_rollups")+`, `+skip("d", "rollup_dirty")+`
		SELECT rank FROM m WHERE rank IS NOT NULL UNION SELECT rank FROM l WHERE rank IS NOT NULL
		UNION SELECT rank FROM d WHERE rank IS NOT NULL ORDER BY 1`, runID)
	if err != nil {
		return nil, fmt.Errorf("store: ranks of %s: %w", runID, err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

// RunStats are whole-run figures from the rollups (refresh them first).
type RunStats struct {
	Rows          int64 // rows of the lowest rank
	FirstStep     *int64
	LastStep      *int64
	Skipped       int64
	MeanThroughpt *float64
	MeanGPUUtil   *float64
	PeakGPUMemGB  *float64 // device memory in use the steps carried (gpu_mem_used_gb)
	AllocPeakGB   *float64 // the allocator's peak the steps carried (gpu_mem_peak_gb)
	MeanStepMS    *float64
	MeanTFLOPS    *float64 // achieved model TFLOP/s per GPU
	MeanMFU       *float64 // model FLOPs utilisation, 0..1
	FinalLoss     *float64
	UserMetrics   []string
}

// RunStats computes whole-run figures over all ranks from the widest
// rollups, and the final loss of the lowest rank from the raw rows.
func (s *Store) RunStats(ctx context.Context, runID string) (*RunStats, error) {
	// One row a metric: the spread of the whole run holds the aggregate
	// over every rank (rollup_spread.go).
	rows, err := s.pool.Query(ctx, `
		SELECT metric, true, min, max, sum, count FROM metric_spread WHERE run_id = $1 AND width = $2 AND bucket = 0`,
		runID, TotalWidth)
	if err != nil {
		return nil, fmt.Errorf("store: run stats of %s: %w", runID, err)
	}
	type agg struct {
		min, max, sum *float64
		n             int64
	}
	m := map[string]agg{}
	st := &RunStats{}
	for rows.Next() {
		var name string
		var ignore bool
		var a agg
		if err := rows.Scan(&name, &ignore, &a.min, &a.max, &a.sum, &a.n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("store: run stats of %s: %w", runID, err)
		}
		m[name] = a
		if strings.HasPrefix(name, "metrics.") {
			st.UserMetrics = append(st.UserMetrics, name)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: run stats of %s: %w", runID, err)
	}
	mean := func(k string) *float64 {
		a, ok := m[k]
		if !ok || a.n == 0 || a.sum == nil {
			return nil
		}
		v := *a.sum / float64(a.n)
		return &v
	}
	if a, ok := m["skipped"]; ok && a.sum != nil {
		st.Skipped = int64(*a.sum)
	}
	st.MeanThroughpt = mean("throughput_sps")
	st.MeanGPUUtil = mean("gpu_util_pct")
	st.MeanStepMS = mean("step_ms")
	st.MeanTFLOPS = mean("tflops")
	st.MeanMFU = mean("mfu")
	st.PeakGPUMemGB = m["gpu_mem_used_gb"].max
	st.AllocPeakGB = m["gpu_mem_peak_gb"].max
	// Steps and span of the lowest rank.
	lowest := -1
	err = s.pool.QueryRow(ctx, `
		SELECT rank, count, min::bigint, max::bigint FROM metric_rollups
		WHERE run_id = $1 AND width = $2 AND bucket = 0 AND metric = 'step' ORDER BY rank LIMIT 1`,
		runID, TotalWidth).Scan(&lowest, &st.Rows, &st.FirstStep, &st.LastStep)
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: run span of %s: %w", runID, err)
	}
	if lowest >= 0 {
		// The newest loss of the lowest rank, looked for in its last
		// 1,000 steps first: on compressed chunks a step range reads a
		// batch or two, a whole rank's steps every batch.
		const newest = `SELECT loss FROM steps WHERE run_id = $1 AND rank = $2 AND step >= $3 AND loss IS NOT NULL
			ORDER BY step DESC, time DESC LIMIT 1`
		err = s.pool.QueryRow(ctx, newest, runID, lowest, *st.LastStep-1000).Scan(&st.FinalLoss)
		if errors.Is(err, pgx.ErrNoRows) {
			err = s.pool.QueryRow(ctx, newest, runID, lowest, int64(0)).Scan(&st.FinalLoss)
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("store: final loss of %s: %w", runID, err)
		}
	}
	return st, nil
}

// EvalStats are the best and final evaluation figures of a run's split.
type EvalStats struct {
	BestAcc, FinalAcc, BestF1, FinalF1, FinalLoss *float64
}

// EvalStats returns figures of the "val" split, or of any split when the
// run has no "val" evaluations.
func (s *Store) EvalStats(ctx context.Context, runID string) (*EvalStats, error) {
	var e EvalStats
	err := s.pool.QueryRow(ctx, `
		WITH e AS (
			SELECT * FROM evals WHERE run_id = $1
			  AND (split = 'val' OR NOT EXISTS (SELECT 1 FROM evals WHERE run_id = $1 AND split = 'val'))
		)
		SELECT (SELECT max(accuracy) FILTER (WHERE accuracy <> 'NaN') FROM e),
		       (SELECT accuracy FROM e WHERE accuracy IS NOT NULL ORDER BY step DESC, time DESC LIMIT 1),
		       (SELECT max(f1) FILTER (WHERE f1 <> 'NaN') FROM e),
		       (SELECT f1 FROM e WHERE f1 IS NOT NULL ORDER BY step DESC, time DESC LIMIT 1),
		       (SELECT loss FROM e WHERE loss IS NOT NULL ORDER BY step DESC, time DESC LIMIT 1)`, runID).
		Scan(&e.BestAcc, &e.FinalAcc, &e.BestF1, &e.FinalF1, &e.FinalLoss)
	if err != nil {
		return nil, fmt.Errorf("store: eval stats of %s: %w", runID, err)
	}
	return &e, nil
}

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

// LayerRow is one step's per-layer timings, or a rollup bucket's per-layer
// sums and counts (Counts nil for a raw row: each value counts once).
type LayerRow struct {
	Step      int64 // raw: the step; rollup: the bucket's first step
	Bucket    int64 // rollup only
	Time      time.Time
	Sums      []*float64
	Counts    []int64
	BwdSums   []*float64
	BwdCounts []int64
}

// LayersRaw returns raw per-layer rows of one rank over [from, to].
func (s *Store) LayersRaw(ctx context.Context, runID string, rank int, from, to int64, backward bool) ([]LayerRow, error) {
	col := "forward_ms"
	if backward {
		col = "backward_ms"
	}
	rows, err := s.pool.Query(ctx, `SELECT step, time, coalesce(`+col+`, '{}') FROM layer_times
		WHERE run_id = $1 AND rank = $2 AND step >= $3 AND step <= $4 ORDER BY step`, runID, rank, from, to)
	if err != nil {
		return nil, fmt.Errorf("store: read layers of %s: %w", runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LayerRow, error) {
		var p LayerRow
		err := r.Scan(&p.Step, &p.Time, &p.Sums)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: read layers of %s: %w", runID, err)
	}
	return out, nil
}

// LayerRollups returns layer rollup buckets of width w in [fromBucket,
// toBucket], with the sums and counts of one pass.
func (s *Store) LayerRollups(ctx context.Context, runID string, rank int, w, fromBucket, toBucket int64, backward bool) ([]LayerRow, error) {
	cols := "fwd_sums, fwd_counts"
	if backward {
		cols = "bwd_sums, bwd_counts"
	}
	rows, err := s.pool.Query(ctx, `SELECT bucket, first_step, first_time, `+cols+` FROM layer_rollups
		WHERE run_id = $1 AND rank = $2 AND width = $3 AND bucket >= $4 AND bucket <= $5 ORDER BY bucket`,
		runID, rank, w, fromBucket, toBucket)
	if err != nil {
		return nil, fmt.Errorf("store: read layer rollups of %s: %w", runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LayerRow, error) {
		var p LayerRow
		err := r.Scan(&p.Bucket, &p.Step, &p.Time, &p.Sums, &p.Counts)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: read layer rollups of %s: %w", runID, err)
	}
	return out, nil
}

// LayerSpan returns the first and last step with layer timings of a rank.
func (s *Store) LayerSpan(ctx context.Context, runID string, rank int) (first, last int64, ok bool, err error) {
	return s.span(ctx, "layer_times", runID, rank)
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

// MemoryRow is a run's predicted ZeRO breakdown.
type MemoryRow struct {
	Params, Grads, Optim, Activations *float64
	OptimDevice, ParamsDevice         string
}

// Memory returns the breakdown of the lowest rank that sent one, or nil.
func (s *Store) Memory(ctx context.Context, runID string) (*MemoryRow, error) {
	var m MemoryRow
	err := s.pool.QueryRow(ctx, `SELECT parameters_bytes, gradients_bytes, optimizer_bytes, activations_bytes,
		optimizer_device, parameters_device FROM memory_breakdowns WHERE run_id = $1 ORDER BY rank LIMIT 1`, runID).
		Scan(&m.Params, &m.Grads, &m.Optim, &m.Activations, &m.OptimDevice, &m.ParamsDevice)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: memory of %s: %w", runID, err)
	}
	return &m, nil
}

// RankHosts returns the host of each rank: the host of its newest GPU
// sample attributed to the run (rank_hosts, kept by ingest).
func (s *Store) RankHosts(ctx context.Context, runID string) (map[int]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT rank, host FROM rank_hosts WHERE run_id = $1`, runID)
	if err != nil {
		return nil, fmt.Errorf("store: hosts of %s: %w", runID, err)
	}
	defer rows.Close()
	out := map[int]string{}
	for rows.Next() {
		var r int
		var h string
		if err := rows.Scan(&r, &h); err != nil {
			return nil, fmt.Errorf("store: hosts of %s: %w", runID, err)
		}
		out[r] = h
	}
	return out, rows.Err()
}
