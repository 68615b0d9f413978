package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
)

// AgentBeat is what an agent says of itself in a heartbeat.
type AgentBeat struct {
	Name     string
	Host     string
	GPUs     []int
	Executor string
	Projects []string
	Running  []int64
	Version  string
}

// BeatReply is what the server answers a heartbeat: the agent's jobs to
// cancel, and the jobs it runs that are no longer its own (lost while it
// was silent; they may run elsewhere now), which it must stop.
type BeatReply struct {
	Cancel []int64
	Drop   []int64
}

// Heartbeat records an agent's heartbeat: it refreshes the agent and the
// jobs it runs, marks lost the jobs the server gave it that it no longer
// runs (claimed more than grace ago, so a claim racing the beat is not
// taken for gone), and answers what to cancel and what to drop.
func (s *Store) Heartbeat(ctx context.Context, b AgentBeat, grace time.Duration) (BeatReply, error) {
	var r BeatReply
	ctx, cancel := context.WithTimeout(ctx, jobTimeout)
	defer cancel()
	running := b.Running
	if running == nil {
		running = []int64{}
	}
	_, err := s.pool.Exec(ctx, `
		INSERT INTO agents (name, host, gpus, executor, projects, version, last_heartbeat)
		VALUES ($1, $2, $3, $4, $5, $6, now())
		ON CONFLICT (name) DO UPDATE SET host = EXCLUDED.host, gpus = EXCLUDED.gpus, executor = EXCLUDED.executor,
			projects = EXCLUDED.projects, version = EXCLUDED.version, last_heartbeat = now()`,
		b.Name, b.Host, intsOrEmpty(b.GPUs), b.Executor, stringsOrEmpty(b.Projects), b.Version)
	if err != nil {
		return r, fmt.Errorf("store: heartbeat of agent %s: %w", b.Name, err)
	}
	rows, err := s.pool.Query(ctx, `
		UPDATE jobs SET heartbeat_at = now() WHERE agent = $1 AND state = 'running' AND id = ANY($2)
		RETURNING id, cancel_requested`, b.Name, running)
	if err != nil {
		return r, fmt.Errorf("store: heartbeat of agent %s: %w", b.Name, err)
	}
	held := map[int64]bool{}
	for rows.Next() {
		var id int64
		var cancelled bool
		if err := rows.Scan(&id, &cancelled); err != nil {
			rows.Close()
			return r, fmt.Errorf("store: heartbeat of agent %s: %w", b.Name, err)
		}
		held[id] = true
		if cancelled {
			r.Cancel = append(r.Cancel, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("store: heartbeat of agent %s: %w", b.Name, err)
	}
	for _, id := range running {
		if !held[id] {
			r.Drop = append(r.Drop, id)
		}
	}
	gone, err := s.queryIDs(ctx, `
		SELECT id FROM jobs WHERE agent = $1 AND state = 'running' AND NOT (id = ANY($2))
		AND COALESCE(started_at, heartbeat_at) < now() - make_interval(secs => $3)`,
		b.Name, running, grace.Seconds())
	if err != nil {
		return r, fmt.Errorf("store: heartbeat of agent %s: jobs it no longer runs: %w", b.Name, err)
	}
	if len(gone) > 0 {
		if _, err := s.markLost(ctx, gone, "the agent "+b.Name+" no longer runs it"); err != nil {
			return r, err
		}
	}
	return r, nil
}

// queryIDs runs a query of one bigint column.
func (s *Store) queryIDs(ctx context.Context, sql string, args ...any) ([]int64, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

func intsOrEmpty(v []int) []int {
	if v == nil {
		return []int{}
	}
	return v
}

func stringsOrEmpty(v []string) []string {
	if v == nil {
		return []string{}
	}
	return v
}

// Claim gives the agent the oldest queued job that fits its free GPUs, of
// one of its projects (any, when it names none) and of no project in
// skip (those over quota), and marks it running on those GPUs. Agents
// claim at once without waiting on each other: a job another claim has
// locked is skipped (FOR UPDATE SKIP LOCKED). It returns nil when no job
// fits.
func (s *Store) Claim(ctx context.Context, agent, executor string, free []int, projects, skip []string) (*api.Job, error) {
	if len(free) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, jobTimeout)
	defer cancel()
	var id int64
	err := s.pool.QueryRow(ctx, `
		WITH pick AS (
			SELECT id FROM jobs
			WHERE state = 'queued' AND gpus <= cardinality($1::int[])
			  AND (cardinality($2::text[]) = 0 OR project = ANY($2))
			  AND NOT (project = ANY($3::text[]))
			ORDER BY id LIMIT 1
			FOR UPDATE SKIP LOCKED)
		UPDATE jobs AS j SET state = 'running', agent = $4, executor = $5, gpu_ids = ($1::int[])[1:j.gpus],
			started_at = now(), heartbeat_at = now(), run_id = 'job-' || j.id
		FROM pick WHERE j.id = pick.id
		RETURNING j.id`, free, stringsOrEmpty(projects), stringsOrEmpty(skip), agent, executor).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: claim for agent %s: %w", agent, err)
	}
	j, err := s.Job(ctx, id)
	if err != nil {
		return nil, err
	}
	return &j, nil
}

// Report records what an agent's executor says of a job it holds. A
// final state ends the job (lost queues a retry when it has retries
// left); queued means the executor has accepted it but not started it
// (a pending Slurm job), so its runtime starts with the running report.
// A job the agent does not hold is ErrNotHeld, one that has ended
// ErrConflict.
func (s *Store) Report(ctx context.Context, agent string, id int64, r api.JobReport) error {
	ctx, cancel := context.WithTimeout(ctx, jobTimeout)
	defer cancel()
	if r.State == JobLost {
		n, err := s.markLostBy(ctx, agent, id, r)
		if err != nil {
			return err
		}
		if n == 0 {
			return s.reportConflict(ctx, agent, id)
		}
		return nil
	}
	var exit *int32
	if r.ExitCode != nil {
		e := int32(*r.ExitCode)
		exit = &e
	}
	tag, err := s.pool.Exec(ctx, `
		UPDATE jobs SET
			state       = CASE WHEN $3 IN ('queued', 'running') THEN 'running' ELSE $3 END,
			started_at  = CASE WHEN $3 = 'queued' THEN NULL WHEN $3 = 'running' THEN COALESCE(started_at, now())
			                   ELSE started_at END,
			ended_at    = CASE WHEN $3 IN ('queued', 'running') THEN NULL
			                   ELSE LEAST(now(), GREATEST(COALESCE($8, now()), started_at)) END,
			heartbeat_at = now(),
			exit_code   = COALESCE($4, exit_code),
			external_id = CASE WHEN $5 = '' THEN external_id ELSE $5 END,
			output_tail = CASE WHEN $6 = '' THEN output_tail ELSE $6 END,
			detail      = CASE WHEN $7 = '' AND $3 = 'queued' THEN 'accepted by the executor, not started yet'
			                   WHEN $7 = '' AND $3 = 'running' THEN ''
			                   ELSE $7 END
		WHERE id = $1 AND agent = $2 AND state = 'running'`,
		id, agent, r.State, exit, r.ExternalID, r.OutputTail, r.Detail, r.EndedAt)
	if err != nil {
		return fmt.Errorf("store: report on job %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return s.reportConflict(ctx, agent, id)
	}
	return nil
}

func (s *Store) reportConflict(ctx context.Context, agent string, id int64) error {
	j, err := s.Job(ctx, id)
	if err != nil {
		return err
	}
	if j.Agent != agent {
		return fmt.Errorf("job %d is not held by agent %s: %w", id, agent, ErrNotHeld)
	}
	return fmt.Errorf("job %d has already ended (%s): %w", id, j.State, ErrConflict)
}

func (s *Store) markLostBy(ctx context.Context, agent string, id int64, r api.JobReport) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE id = $1 AND agent = $2 AND state = 'running'`, id, agent).Scan(&n)
	if err != nil || n == 0 {
		return 0, err
	}
	detail := r.Detail
	if detail == "" {
		detail = "the agent " + agent + " lost it"
	}
	if r.OutputTail != "" {
		if _, err := s.pool.Exec(ctx, `UPDATE jobs SET output_tail = $2 WHERE id = $1`, id, r.OutputTail); err != nil {
			return 0, fmt.Errorf("store: report on job %d: %w", id, err)
		}
	}
	return s.markLost(ctx, []int64{id}, detail)
}

// markLost ends running jobs as lost and queues a new attempt of each
// that has retries left and was not being cancelled. The retry says why
// it exists (attempt, retry_of and its detail), and the lost job which
// attempt retries it. It returns how many it marked.
func (s *Store) markLost(ctx context.Context, ids []int64, detail string) (int, error) {
	var lost, retried int
	var from, to []int64 // a lost job, its retry
	err := s.pool.QueryRow(ctx, `
		WITH lost AS (
			UPDATE jobs SET state = 'lost', ended_at = now(), detail = $2
			WHERE id = ANY($1) AND state = 'running'
			RETURNING *),
		retry AS (
			INSERT INTO jobs (project, sweep_id, argv, params, gpus, retries, attempt, retry_of, detail)
			SELECT project, sweep_id, argv, params, gpus, retries - 1, attempt + 1, id,
			       format('attempt %s, retrying job %s, whose outcome is unknown: %s', attempt + 1, id, $2)
			FROM lost WHERE retries > 0 AND NOT cancel_requested ORDER BY id
			RETURNING id, retry_of)
		SELECT (SELECT count(*) FROM lost), (SELECT count(*) FROM retry),
		       COALESCE((SELECT array_agg(retry_of ORDER BY id) FROM retry), '{}'),
		       COALESCE((SELECT array_agg(id ORDER BY id) FROM retry), '{}')`, ids, detail).Scan(&lost, &retried, &from, &to)
	if err != nil {
		return 0, fmt.Errorf("store: mark jobs lost: %w", err)
	}
	if len(from) > 0 {
		if _, err := s.pool.Exec(ctx, `UPDATE jobs AS j SET detail = j.detail || '; retried as job ' || u.retry
			FROM unnest($1::bigint[], $2::bigint[]) AS u(lost, retry) WHERE j.id = u.lost`, from, to); err != nil {
			return 0, fmt.Errorf("store: mark jobs lost: name their retries: %w", err)
		}
	}
	if lost > 0 {
		s.log.Info("jobs lost", "jobs", ids, "why", detail, "retried", retried)
	}
	return lost, nil
}

// ReapLost marks lost every running job with no heartbeat for longer
// than timeout (its agent died, or lost its network) and queues retries.
// It returns how many it marked.
func (s *Store) ReapLost(ctx context.Context, timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, jobTimeout)
	defer cancel()
	ids, err := s.queryIDs(ctx, `
		SELECT id FROM jobs WHERE state = 'running'
		AND COALESCE(heartbeat_at, started_at, created_at) < now() - make_interval(secs => $1)`, timeout.Seconds())
	if err != nil {
		return 0, fmt.Errorf("store: find silent jobs: %w", err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	return s.markLost(ctx, ids, fmt.Sprintf("no heartbeat from its agent for %s", timeout))
}

// Agents lists the agents that have sent a heartbeat, with how many jobs
// each runs; alive means one came within timeout.
func (s *Store) Agents(ctx context.Context, timeout time.Duration) ([]api.Agent, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT a.name, a.host, a.gpus, a.executor, a.projects, a.version, a.last_heartbeat,
		       a.last_heartbeat >= now() - make_interval(secs => $1),
		       (SELECT count(*) FROM jobs j WHERE j.agent = a.name AND j.state = 'running')
		FROM agents a ORDER BY a.name`, timeout.Seconds())
	if err != nil {
		return nil, fmt.Errorf("store: list agents: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.Agent, error) {
		var a api.Agent
		var gpus []int32
		err := r.Scan(&a.Name, &a.Host, &gpus, &a.Executor, &a.Projects, &a.Version, &a.LastHeartbeat, &a.Alive, &a.Running)
		a.GPUs = []int{}
		for _, g := range gpus {
			a.GPUs = append(a.GPUs, int(g))
		}
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: list agents: %w", err)
	}
	return out, nil
}
