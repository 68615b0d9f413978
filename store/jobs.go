package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
)

// Job states (the agent package names the same ones).
const (
	JobQueued    = "queued"
	JobRunning   = "running"
	JobFinished  = "finished"
	JobFailed    = "failed"
	JobCancelled = "cancelled"
	JobLost      = "lost"
)

// ErrConflict is returned when a job's state forbids the change asked for
// (cancelling a finished job, a report from an agent that no longer holds
// the job).
var ErrConflict = errors.New("conflict")

// ErrNotHeld is returned when an agent reports on a job another agent
// holds, or one no agent has claimed.
var ErrNotHeld = errors.New("not this agent's job")

// NewJob is one job to queue.
type NewJob struct {
	Project string
	SweepID string
	Argv    []string
	Params  map[string]string
	GPUs    int
	Retries int
}

// jobColumns are read by scanJob, in its order. The run is the job's own
// run id once a run of that id exists, else the newest run that named the
// job in its meta.
const jobColumns = `j.id, j.project, j.sweep_id, j.state, j.argv, j.params, j.gpus, j.gpu_ids, j.agent, j.executor,
	j.external_id, j.exit_code, j.output_tail, j.detail,
	COALESCE((SELECT r.run_id FROM runs r WHERE r.run_id = j.run_id AND j.run_id <> ''),
	         (SELECT r.run_id FROM runs r WHERE r.meta ? 'job_id' AND r.meta->>'job_id' = j.id::text
	          ORDER BY r.created_at DESC LIMIT 1), ''),
	j.retries, j.attempt, j.retry_of, j.cancel_requested, j.created_at, j.started_at, j.ended_at, j.heartbeat_at,
	COALESCE(extract(epoch FROM COALESCE(j.ended_at, now()) - j.started_at), 0)::float8`

func scanJob(row pgx.Row) (api.Job, error) {
	var j api.Job
	var params []byte
	var gpuIDs []int32
	var exit *int32
	err := row.Scan(&j.ID, &j.Project, &j.SweepID, &j.State, &j.Argv, &params, &j.GPUs, &gpuIDs, &j.Agent, &j.Executor,
		&j.ExternalID, &exit, &j.OutputTail, &j.Detail, &j.RunID,
		&j.Retries, &j.Attempt, &j.RetryOf, &j.CancelRequested, &j.CreatedAt, &j.StartedAt, &j.EndedAt, &j.HeartbeatAt,
		&j.RuntimeSeconds)
	if err != nil {
		return j, err
	}
	if len(params) > 0 {
		if err := json.Unmarshal(params, &j.Params); err != nil {
			return j, fmt.Errorf("job %d params: %w", j.ID, err)
		}
	}
	if len(j.Params) == 0 {
		j.Params = nil
	}
	for _, g := range gpuIDs {
		j.GPUIDs = append(j.GPUIDs, int(g))
	}
	if exit != nil {
		e := int(*exit)
		j.ExitCode = &e
	}
	if j.RuntimeSeconds < 0 {
		j.RuntimeSeconds = 0
	}
	j.GPUHours = j.RuntimeSeconds * float64(len(j.GPUIDs)) / 3600
	return j, nil
}

// JobTx is the transaction in which [Store.CreateJobs] queues jobs, as a
// [JobCheck] reads it.
type JobTx struct{ tx pgx.Tx }

// Usage returns the quota and usage of each project (see [Store.Quota]),
// read inside the transaction.
func (t JobTx) Usage(ctx context.Context, projects []string) (map[string]api.Quota, error) {
	return usage(ctx, t.tx, projects)
}

// JobCheck decides, inside the transaction that queues jobs, whether they
// may be queued; an error it returns is CreateJobs' answer.
type JobCheck func(ctx context.Context, tx JobTx) error

// CreateJobs queues jobs in one transaction, after fn (when not nil) has
// checked, inside it, that they may be queued: fn runs under an advisory
// lock per project, so two submissions of one project see each other's
// jobs when fn reads the quota. It returns the jobs in order.
func (s *Store) CreateJobs(ctx context.Context, jobs []NewJob, check JobCheck) ([]api.Job, error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: create jobs: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it does nothing
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey(jobs[0].Project, "jobs")); err != nil {
		return nil, fmt.Errorf("store: create jobs: lock project: %w", err)
	}
	if check != nil {
		if err := check(ctx, JobTx{tx}); err != nil {
			return nil, err
		}
	}
	var (
		project, sweep, params []string
		argv                   []string // JSON arrays: argv is text[] per job
		gpus, retries          []int32
	)
	for _, j := range jobs {
		p, err := json.Marshal(orEmpty(j.Params))
		if err != nil {
			return nil, fmt.Errorf("store: create jobs: params: %w", err)
		}
		a, err := json.Marshal(j.Argv)
		if err != nil {
			return nil, fmt.Errorf("store: create jobs: argv: %w", err)
		}
		project = append(project, j.Project)
		sweep = append(sweep, j.SweepID)
		params = append(params, string(p))
		argv = append(argv, string(a))
		gpus = append(gpus, int32(j.GPUs))
		retries = append(retries, int32(j.Retries))
	}
	rows, err := tx.Query(ctx, `
		INSERT INTO jobs (project, sweep_id, argv, params, gpus, retries)
		SELECT u.project, u.sweep_id, ARRAY(SELECT jsonb_array_elements_text(u.argv::jsonb)), u.params::jsonb, u.gpus, u.retries
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::int[]) WITH ORDINALITY
		     AS u(project, sweep_id, argv, params, gpus, retries, n)
		ORDER BY u.n
		RETURNING id`, project, sweep, argv, params, gpus, retries)
	if err != nil {
		return nil, fmt.Errorf("store: create jobs: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("store: create jobs: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("store: create jobs: commit: %w", err)
	}
	return s.jobsByID(ctx, ids)
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func (s *Store) jobsByID(ctx context.Context, ids []int64) ([]api.Job, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+jobColumns+` FROM jobs j WHERE j.id = ANY($1) ORDER BY j.id`, ids)
	if err != nil {
		return nil, fmt.Errorf("store: read jobs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.Job, error) { return scanJob(r) })
	if err != nil {
		return nil, fmt.Errorf("store: read jobs: %w", err)
	}
	return out, nil
}

// Job returns one job, or ErrNotFound.
func (s *Store) Job(ctx context.Context, id int64) (api.Job, error) {
	j, err := scanJob(s.pool.QueryRow(ctx, `SELECT `+jobColumns+` FROM jobs j WHERE j.id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return j, ErrNotFound
	}
	if err != nil {
		return j, fmt.Errorf("store: job %d: %w", id, err)
	}
	return j, nil
}

// JobFilter selects jobs; empty fields match every job.
type JobFilter struct {
	Project string
	SweepID string
	State   string
	Agent   string
	Limit   int // most jobs returned, newest first; 0 means 100
}

const jobFilterWhere = `($1 = '' OR j.project = $1) AND ($2 = '' OR j.sweep_id = $2)
	AND ($3 = '' OR j.state = $3) AND ($4 = '' OR j.agent = $4)`

// Jobs returns the newest jobs that match f and the counts of all of them.
func (s *Store) Jobs(ctx context.Context, f JobFilter) ([]api.Job, api.JobCounts, error) {
	var counts api.JobCounts
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	rows, err := s.pool.Query(ctx, `SELECT `+jobColumns+` FROM jobs j WHERE `+jobFilterWhere+` ORDER BY j.id DESC LIMIT $5`,
		f.Project, f.SweepID, f.State, f.Agent, limit)
	if err != nil {
		return nil, counts, fmt.Errorf("store: list jobs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.Job, error) { return scanJob(r) })
	if err != nil {
		return nil, counts, fmt.Errorf("store: list jobs: %w", err)
	}
	counts, err = s.jobCounts(ctx, f)
	return out, counts, err
}

func (s *Store) jobCounts(ctx context.Context, f JobFilter) (api.JobCounts, error) {
	var c api.JobCounts
	rows, err := s.pool.Query(ctx, `SELECT j.state, count(*) FROM jobs j WHERE `+jobFilterWhere+` GROUP BY j.state`,
		f.Project, f.SweepID, f.State, f.Agent)
	if err != nil {
		return c, fmt.Errorf("store: count jobs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var state string
		var n int
		if err := rows.Scan(&state, &n); err != nil {
			return c, fmt.Errorf("store: count jobs: %w", err)
		}
		addCount(&c, state, n)
	}
	return c, rows.Err()
}

// addCount adds n jobs in state to c: active is queued plus running,
// failed counts lost jobs too.
func addCount(c *api.JobCounts, state string, n int) {
	c.Total += n
	switch state {
	case JobQueued:
		c.Queued += n
	case JobRunning:
		c.Running += n
	case JobFinished:
		c.Done += n
	case JobFailed:
		c.Failed += n
	case JobCancelled:
		c.Cancelled += n
	case JobLost:
		c.Lost += n
		c.Failed += n
	}
	c.Active = c.Queued + c.Running
}

// CancelJob cancels a queued job at once and asks the agent of a running
// one to stop it (its next heartbeat hears so). A job that has ended is
// ErrConflict; an unknown one ErrNotFound.
func (s *Store) CancelJob(ctx context.Context, id int64) (api.Job, error) {
	tag, err := s.pool.Exec(ctx, `
		UPDATE jobs SET
			state = CASE WHEN state = 'queued' THEN 'cancelled' ELSE state END,
			ended_at = CASE WHEN state = 'queued' THEN now() ELSE ended_at END,
			detail = CASE WHEN state = 'queued' THEN 'cancelled before it started' ELSE detail END,
			cancel_requested = true
		WHERE id = $1 AND state IN ('queued', 'running')`, id)
	if err != nil {
		return api.Job{}, fmt.Errorf("store: cancel job %d: %w", id, err)
	}
	j, err := s.Job(ctx, id)
	if err != nil {
		return j, err
	}
	if tag.RowsAffected() == 0 {
		return j, fmt.Errorf("job %d has already ended (%s): %w", id, j.State, ErrConflict)
	}
	return j, nil
}

// jobTimeout bounds each statement of the claim and report paths.
const jobTimeout = 10 * time.Second
