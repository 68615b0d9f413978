-- The base schema. Works on plain PostgreSQL 15+; when the timescaledb
-- extension is present the store turns the time-series tables into
-- hypertables after the migrations have run (see store/timescale.go), so
-- every table here keeps its time column inside each unique index.

CREATE TABLE runs (
    run_id       text PRIMARY KEY,
    project      text NOT NULL DEFAULT 'default',
    name         text NOT NULL DEFAULT '',
    status       text NOT NULL DEFAULT 'running',
    started_at   timestamptz,
    ended_at     timestamptz,
    last_seen_at timestamptz,
    config       jsonb NOT NULL DEFAULT '{}',
    meta         jsonb NOT NULL DEFAULT '{}',
    params       jsonb NOT NULL DEFAULT '{}',
    summary      jsonb NOT NULL DEFAULT '{}',
    tags         text[] NOT NULL DEFAULT '{}',
    sweep_id     text NOT NULL DEFAULT '',
    -- Layer names in model order; every layer_times row's arrays follow it.
    layer_names  text[] NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX runs_project_started ON runs (project, started_at DESC);
CREATE INDEX runs_started ON runs (started_at DESC NULLS LAST, run_id);
CREATE INDEX runs_sweep ON runs (sweep_id) WHERE sweep_id <> '';
CREATE INDEX runs_tags ON runs USING gin (tags);

-- One row per run, rank and step. A redone step (resumed run) arrives with
-- a newer time: ingest deletes the older row in the same transaction, so
-- readers never see two rows for one (run_id, rank, step).
CREATE TABLE steps (
    run_id              text NOT NULL,
    rank                integer NOT NULL,
    step                bigint NOT NULL,
    time                timestamptz NOT NULL,
    epoch               double precision,
    loss                double precision,
    lr                  double precision,
    grad_norm           double precision,
    loss_scale          double precision,
    skipped             boolean,
    samples             bigint,
    tokens              bigint,
    throughput_sps      double precision,
    throughput_tps      double precision,
    step_ms             double precision,
    forward_ms          double precision,
    backward_ms         double precision,
    optimizer_ms        double precision,
    comm_ms             double precision,
    data_ms             double precision,
    gpu_util_pct        double precision,
    gpu_mem_used_gb     double precision,
    gpu_mem_peak_gb     double precision,
    gpu_mem_reserved_gb double precision,
    cpu_util_pct        double precision,
    metrics             jsonb,
    UNIQUE (run_id, rank, step, time)
);

-- Per-layer timings: one row per run, rank and step, the layers as arrays
-- in the order of runs.layer_names (NULL where a layer was not measured).
-- 1,000,000 steps x 64 ranks is 64 M rows of two small arrays, instead of
-- 6.4 G rows of one number each.
CREATE TABLE layer_times (
    run_id      text NOT NULL,
    rank        integer NOT NULL,
    step        bigint NOT NULL,
    time        timestamptz NOT NULL,
    forward_ms  double precision[] NOT NULL,
    backward_ms double precision[],
    UNIQUE (run_id, rank, step, time)
);

CREATE TABLE evals (
    run_id   text NOT NULL,
    step     bigint NOT NULL,
    time     timestamptz NOT NULL,
    split    text NOT NULL DEFAULT 'val',
    loss     double precision,
    accuracy double precision,
    f1       double precision,
    metrics  jsonb,
    UNIQUE (run_id, split, step, time)
);

CREATE TABLE gpu_samples (
    time                 timestamptz NOT NULL,
    host                 text NOT NULL,
    gpu                  integer NOT NULL,
    uuid                 text NOT NULL DEFAULT '',
    name                 text NOT NULL DEFAULT '',
    run_id               text NOT NULL DEFAULT '',
    rank                 integer,
    util_pct             double precision,
    mem_util_pct         double precision,
    mem_used_bytes       double precision,
    mem_total_bytes      double precision,
    mem_reserved_bytes   double precision,
    power_w              double precision,
    energy_j             double precision,
    temp_c               double precision,
    mem_temp_c           double precision,
    sm_clock_mhz         double precision,
    mem_clock_mhz        double precision,
    pcie_tx_bytes_per_s  double precision,
    pcie_rx_bytes_per_s  double precision,
    pcie_replay_total    double precision,
    nvlink_tx_bytes_per_s double precision,
    nvlink_rx_bytes_per_s double precision,
    xid_last             double precision,
    xid_total            double precision,
    ecc_corrected_total  double precision,
    ecc_uncorrected_total double precision,
    remapped_rows_total  double precision,
    throttle_reasons     bigint,
    sm_active_pct        double precision,
    sm_occupancy_pct     double precision,
    tensor_active_pct    double precision,
    gr_engine_active_pct double precision,
    processes            jsonb,
    UNIQUE (host, gpu, time)
);
CREATE INDEX gpu_samples_run ON gpu_samples (run_id, time) WHERE run_id <> '';

CREATE TABLE host_samples (
    time            timestamptz NOT NULL,
    host            text NOT NULL,
    cpu_util_pct    double precision,
    mem_used_bytes  double precision,
    mem_total_bytes double precision,
    load1           double precision,
    processes       jsonb,
    UNIQUE (host, time)
);

-- The predicted ZeRO breakdown per run and rank; the newest record wins.
CREATE TABLE memory_breakdowns (
    run_id            text NOT NULL,
    rank              integer NOT NULL DEFAULT 0,
    time              timestamptz NOT NULL,
    parameters_bytes  double precision,
    gradients_bytes   double precision,
    optimizer_bytes   double precision,
    optimizer_device  text NOT NULL DEFAULT 'gpu',
    parameters_device text NOT NULL DEFAULT 'gpu',
    activations_bytes double precision,
    PRIMARY KEY (run_id, rank)
);

-- Events: checkpoints, overflow skips, restarts, notes. step and rank are
-- -1 when absent so that the unique index also dedupes them.
CREATE TABLE events (
    run_id text NOT NULL,
    time   timestamptz NOT NULL,
    step   bigint NOT NULL DEFAULT -1,
    rank   integer NOT NULL DEFAULT -1,
    type   text NOT NULL,
    text   text NOT NULL DEFAULT ''
);
-- md5 keeps long texts out of the btree while still deduplicating them.
CREATE UNIQUE INDEX events_dedupe ON events (run_id, time, type, step, rank, md5(text));

-- Step blocks whose pre-aggregated rollups are stale. Ingest adds
-- (run_id, rank, step / 100) for every step and layers row it writes, in
-- the same transaction; the query service refreshes the rollups of dirty
-- blocks before it reads them.
CREATE TABLE rollup_dirty (
    run_id text NOT NULL,
    rank   integer NOT NULL,
    block  bigint NOT NULL,
    PRIMARY KEY (run_id, rank, block)
);
