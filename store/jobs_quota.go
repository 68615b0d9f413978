package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
)

// querier is what the quota reads need: the pool, or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// usageSQL computes GPU-hours per project of $1. What counts towards a
// quota is the jobs' own accounting, as a batch scheduler's is: runtime
// from the executor's start to its end (until now while they run) times
// the GPUs held. Runs that no job started are shown beside it from
// telemetry, per GPU the collector attributed to them the span from its
// first to its last sample, clamped to the run's lifetime as the server
// saw it (from the first record it received to the last), so sample
// times a client chose cannot stretch it; that figure never refuses a
// job.
const usageSQL = `
	WITH p AS (SELECT unnest($1::text[]) AS project),
	job AS (
		SELECT project, sum(extract(epoch FROM COALESCE(ended_at, now()) - started_at) * cardinality(gpu_ids)) / 3600 AS h
		FROM jobs WHERE project = ANY($1) AND started_at IS NOT NULL GROUP BY project),
	free_runs AS (
		SELECT r.run_id, r.project, r.created_at, r.updated_at FROM runs r
		WHERE r.project = ANY($1) AND NOT (r.meta ? 'job_id')
		  AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.run_id = r.run_id AND j.run_id <> '')),
	run AS (
		SELECT f.project, sum(g.span) / 3600 AS h FROM free_runs f
		CROSS JOIN LATERAL (
			SELECT GREATEST(extract(epoch FROM LEAST(max(time), f.updated_at) - GREATEST(min(time), f.created_at)), 0) AS span
			FROM gpu_samples WHERE run_id = f.run_id GROUP BY host, gpu) g
		GROUP BY f.project)
	SELECT p.project, COALESCE(job.h, 0)::float8, COALESCE(run.h, 0)::float8, q.gpu_hours
	FROM p LEFT JOIN job USING (project) LEFT JOIN run USING (project) LEFT JOIN quotas q USING (project)`

// usage returns the quota and usage of each project, through q (the pool
// or a transaction). Projects without a quota have GPUHours nil.
func usage(ctx context.Context, q querier, projects []string) (map[string]api.Quota, error) {
	rows, err := q.Query(ctx, usageSQL, projects)
	if err != nil {
		return nil, fmt.Errorf("store: gpu usage: %w", err)
	}
	out := map[string]api.Quota{}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.Quota, error) {
		var u api.Quota
		err := r.Scan(&u.Project, &u.JobGPUHours, &u.RunGPUHours, &u.GPUHours)
		u.UsedGPUHours = u.JobGPUHours
		u.Exceeded = u.GPUHours != nil && u.UsedGPUHours >= *u.GPUHours
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: gpu usage: %w", err)
	}
	for _, u := range list {
		out[u.Project] = u
	}
	return out, nil
}

// Quota returns one project's quota and usage.
func (s *Store) Quota(ctx context.Context, project string) (api.Quota, error) {
	m, err := usage(ctx, s.pool, []string{project})
	if err != nil {
		return api.Quota{}, err
	}
	return m[project], nil
}

// Quotas returns every project that has a quota, with its usage.
func (s *Store) Quotas(ctx context.Context) ([]api.Quota, error) {
	rows, err := s.pool.Query(ctx, `SELECT project FROM quotas ORDER BY project`)
	if err != nil {
		return nil, fmt.Errorf("store: list quotas: %w", err)
	}
	projects, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: list quotas: %w", err)
	}
	m, err := usage(ctx, s.pool, projects)
	if err != nil {
		return nil, err
	}
	out := make([]api.Quota, 0, len(projects))
	for _, p := range projects {
		out = append(out, m[p])
	}
	return out, nil
}

// OverQuota lists the projects whose usage has reached their quota.
func (s *Store) OverQuota(ctx context.Context) ([]string, error) {
	qs, err := s.Quotas(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, q := range qs {
		if q.Exceeded {
			out = append(out, q.Project)
		}
	}
	return out, nil
}

// SetQuota sets a project's GPU-hour limit; nil removes it.
func (s *Store) SetQuota(ctx context.Context, project string, gpuHours *float64) error {
	var err error
	if gpuHours == nil {
		_, err = s.pool.Exec(ctx, `DELETE FROM quotas WHERE project = $1`, project)
	} else {
		_, err = s.pool.Exec(ctx, `INSERT INTO quotas (project, gpu_hours) VALUES ($1, $2)
			ON CONFLICT (project) DO UPDATE SET gpu_hours = EXCLUDED.gpu_hours, updated_at = now()`, project, *gpuHours)
	}
	if err != nil {
		return fmt.Errorf("store: set quota of %s: %w", project, err)
	}
	return nil
}

// ProjectKnown reports whether a run or a job has the project, or an
// agent names it.
func (s *Store) ProjectKnown(ctx context.Context, project string) (bool, error) {
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM runs WHERE project = $1)
		OR EXISTS (SELECT 1 FROM jobs WHERE project = $1)
		OR EXISTS (SELECT 1 FROM agents WHERE $1 = ANY(projects))
		OR EXISTS (SELECT 1 FROM quotas WHERE project = $1)`, project).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("store: is project %s known: %w", project, err)
	}
	return ok, nil
}

// MostAgentGPUs returns the most GPUs of any agent that serves project
// (names it, or names none) and has beaten within the last day, and how
// many such agents there are.
func (s *Store) MostAgentGPUs(ctx context.Context, project string) (most, agents int, err error) {
	err = s.pool.QueryRow(ctx, `SELECT COALESCE(max(cardinality(gpus)), 0), count(*) FROM agents
		WHERE (cardinality(projects) = 0 OR $1 = ANY(projects)) AND last_heartbeat > now() - interval '1 day'`,
		project).Scan(&most, &agents)
	if err != nil {
		return 0, 0, fmt.Errorf("store: agents of project %s: %w", project, err)
	}
	return most, agents, nil
}

// NewSweep is a sweep to create with its jobs.
type NewSweep struct {
	ID      string
	Project string
	Argv    []string
	Spec    map[string]string
	Trials  int
	GPUs    int
	Metric  string
	Goal    string
}

// CreateSweep stores the sweep and queues its jobs in one transaction,
// after check (see CreateJobs).
func (s *Store) CreateSweep(ctx context.Context, sw NewSweep, jobs []NewJob, check JobCheck) error {
	_, err := s.CreateJobs(ctx, jobs, func(ctx context.Context, jt JobTx) error {
		if check != nil {
			if err := check(ctx, jt); err != nil {
				return err
			}
		}
		_, err := jt.tx.Exec(ctx, `INSERT INTO sweeps (id, project, argv, spec, trials, gpus, metric, goal)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, sw.ID, sw.Project, sw.Argv, orEmpty(sw.Spec), sw.Trials, sw.GPUs, sw.Metric, sw.Goal)
		if err != nil {
			return fmt.Errorf("store: create sweep: %w", err)
		}
		return nil
	})
	return err
}

// GetSweep returns a sweep (its jobs not included), or ErrNotFound.
func (s *Store) GetSweep(ctx context.Context, id string) (api.Sweep, error) {
	var sw api.Sweep
	err := s.pool.QueryRow(ctx, `SELECT id, project, argv, spec, gpus, metric, goal, created_at FROM sweeps WHERE id = $1`, id).
		Scan(&sw.ID, &sw.Project, &sw.Argv, &sw.Params, &sw.GPUs, &sw.Metric, &sw.Goal, &sw.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return sw, ErrNotFound
	}
	if err != nil {
		return sw, fmt.Errorf("store: sweep %s: %w", id, err)
	}
	return sw, nil
}

// Sweeps returns the newest sweeps of project (of every project when it
// is empty), at most limit, each with the counters of its jobs.
func (s *Store) Sweeps(ctx context.Context, project string, limit int) ([]api.SweepSummary, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, project, argv, spec, gpus, metric, goal, created_at FROM sweeps
		WHERE $1 = '' OR project = $1 ORDER BY created_at DESC, id LIMIT $2`, project, limit)
	if err != nil {
		return nil, fmt.Errorf("store: list sweeps: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.SweepSummary, error) {
		var sw api.SweepSummary
		err := r.Scan(&sw.ID, &sw.Project, &sw.Argv, &sw.Params, &sw.GPUs, &sw.Metric, &sw.Goal, &sw.CreatedAt)
		return sw, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: list sweeps: %w", err)
	}
	ids := make([]string, len(out))
	at := make(map[string]int, len(out))
	for i, sw := range out {
		ids[i], at[sw.ID] = sw.ID, i
	}
	rows, err = s.pool.Query(ctx, `SELECT sweep_id, state, count(*) FROM jobs WHERE sweep_id = ANY($1)
		GROUP BY sweep_id, state`, ids)
	if err != nil {
		return nil, fmt.Errorf("store: count the jobs of sweeps: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, state string
		var n int
		if err := rows.Scan(&id, &state, &n); err != nil {
			return nil, fmt.Errorf("store: count the jobs of sweeps: %w", err)
		}
		addCount(&out[at[id]].Counts, state, n)
	}
	return out, rows.Err()
}

// MetricValues is a run's eval metric: its last value and its lowest and
// highest.
type MetricValues struct {
	Final, Min, Max float64
}

// RunMetrics reads metric of each run. A metric is "<split>_<name>" for
// loss, accuracy, f1 or a key of an evaluation's metrics of that split
// ("val_accuracy", "val_bleu"), or a bare key of metrics of any split.
// Runs without a value are left out.
func (s *Store) RunMetrics(ctx context.Context, runIDs []string, metric string) (map[string]MetricValues, error) {
	rows, err := s.pool.Query(ctx, `
		WITH v AS (
			SELECT run_id, step, time,
				CASE WHEN $2 = split || '_loss' THEN loss
				     WHEN $2 = split || '_accuracy' THEN accuracy
				     WHEN $2 = split || '_f1' THEN f1
				     WHEN starts_with($2, split || '_') AND jsonb_typeof(metrics->substr($2, length(split) + 2)) = 'number'
				          THEN (metrics->>substr($2, length(split) + 2))::float8
				     WHEN jsonb_typeof(metrics->$2) = 'number' THEN (metrics->>$2)::float8
				END AS value
			FROM evals WHERE run_id = ANY($1))
		SELECT run_id, (array_agg(value ORDER BY step DESC, time DESC))[1], min(value), max(value)
		FROM v WHERE value IS NOT NULL AND value <> 'NaN'::float8 GROUP BY run_id`, runIDs, metric)
	if err != nil {
		return nil, fmt.Errorf("store: metric %s of runs: %w", metric, err)
	}
	out := map[string]MetricValues{}
	defer rows.Close()
	for rows.Next() {
		var id string
		var v MetricValues
		if err := rows.Scan(&id, &v.Final, &v.Min, &v.Max); err != nil {
			return nil, fmt.Errorf("store: metric %s of runs: %w", metric, err)
		}
		out[id] = v
	}
	return out, rows.Err()
}
