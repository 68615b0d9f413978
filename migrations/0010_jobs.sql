-- Jobs, sweeps, GPU quotas and the agents that run jobs (package jobs on
-- the server, package agent on the GPU nodes).
--
-- A sweep is a template: its argv holds {name} placeholders and its spec
-- the parameters as given (values or ranges); its trials are jobs.
CREATE TABLE sweeps (
    id         text PRIMARY KEY,
    project    text NOT NULL,
    argv       text[] NOT NULL,
    spec       jsonb NOT NULL DEFAULT '{}',
    trials     integer NOT NULL,
    gpus       integer NOT NULL,
    metric     text NOT NULL DEFAULT '',
    goal       text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sweeps_project ON sweeps (project, created_at DESC);

-- One row per attempt of a job. Queued jobs are claimed oldest first with
-- FOR UPDATE SKIP LOCKED; a lost attempt that has retries left queues a
-- new row (retry_of names the lost one, attempt counts up). gpu_ids are
-- the GPUs the agent held for it; output_tail is bounded by the agent.
CREATE TABLE jobs (
    id               bigserial PRIMARY KEY,
    project          text NOT NULL,
    sweep_id         text NOT NULL DEFAULT '',
    state            text NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'running', 'finished', 'failed', 'cancelled', 'lost')),
    argv             text[] NOT NULL CHECK (cardinality(argv) > 0),
    params           jsonb NOT NULL DEFAULT '{}',
    gpus             integer NOT NULL CHECK (gpus >= 1),
    gpu_ids          integer[] NOT NULL DEFAULT '{}',
    agent            text NOT NULL DEFAULT '',
    executor         text NOT NULL DEFAULT '',
    external_id      text NOT NULL DEFAULT '',
    exit_code        integer,
    output_tail      text NOT NULL DEFAULT '',
    detail           text NOT NULL DEFAULT '',
    run_id           text NOT NULL DEFAULT '',
    retries          integer NOT NULL DEFAULT 0 CHECK (retries >= 0),
    attempt          integer NOT NULL DEFAULT 1,
    retry_of         bigint,
    cancel_requested boolean NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    ended_at         timestamptz,
    heartbeat_at     timestamptz
);
CREATE INDEX jobs_queued ON jobs (id) WHERE state = 'queued';
CREATE INDEX jobs_running ON jobs (agent) WHERE state = 'running';
CREATE INDEX jobs_project ON jobs (project, id DESC);
CREATE INDEX jobs_sweep ON jobs (sweep_id, id) WHERE sweep_id <> '';
CREATE INDEX jobs_run ON jobs (run_id) WHERE run_id <> '';

-- A project's GPU-hour limit. Usage is computed, never stored.
CREATE TABLE quotas (
    project    text PRIMARY KEY,
    gpu_hours  double precision NOT NULL CHECK (gpu_hours >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Agents as their last heartbeat described them. An empty projects list
-- serves every project.
CREATE TABLE agents (
    name           text PRIMARY KEY,
    host           text NOT NULL DEFAULT '',
    gpus           integer[] NOT NULL DEFAULT '{}',
    executor       text NOT NULL DEFAULT '',
    projects       text[] NOT NULL DEFAULT '{}',
    version        text NOT NULL DEFAULT '',
    first_seen_at  timestamptz NOT NULL DEFAULT now(),
    last_heartbeat timestamptz NOT NULL DEFAULT now()
);

-- A run started by a job names it in its meta (the hook reads
-- DEEPSEED_JOB_ID); the job list finds its run through this index when
-- the run chose its own id.
CREATE INDEX runs_job ON runs ((meta->>'job_id')) WHERE meta ? 'job_id';
