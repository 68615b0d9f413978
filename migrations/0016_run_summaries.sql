-- A summary of each run, so that compare, the runs list and sweep
-- tables read one row a run instead of every rank's rollups
-- (docs/scale.md). It holds what compare shows of a run's steady state,
-- aggregated over its ranks, and the generation of the run's rollups it
-- was computed from.
--
-- Every rollup refresh of a run bumps rollup_gen in its own transaction
-- (and notes, the first time it passes summary_gen, when and how many
-- rank-blocks since); the background refresher recomputes the figures of
-- the runs whose summary_gen is behind and sets summary_gen to the
-- rollup_gen it read before it started, only if that is still the
-- current one. A reader that finds summary_gen = rollup_gen and no rollup
-- markers reads exactly what the rollups would give it; one that finds it
-- behind says by how much (rollup_lag).
CREATE TABLE run_summaries (
    run_id        text PRIMARY KEY,
    rollup_gen    bigint NOT NULL DEFAULT 0,
    summary_gen   bigint NOT NULL DEFAULT -1,
    stale_since   timestamptz,          -- when rollup_gen first passed summary_gen
    stale_blocks  bigint NOT NULL DEFAULT 0, -- rank-blocks refreshed since then
    summarized_at timestamptz,
    -- The steady state (query/steady.go) and its aggregates over ranks.
    ranks         integer,
    lowest_rank   integer,
    rows          bigint,               -- the raw step rows of the steady state
    steady_from   bigint,
    window_from   timestamptz,
    window_to     timestamptz,
    step_ms       double precision,     -- mean over ranks of each rank's mean
    steps_per_s   double precision,     -- mean over ranks of steps advanced a second
    throughput_sps double precision,    -- summed over ranks
    gpu_mem_gb    double precision,     -- mean
    gpu_mem_used_peak_gb double precision, -- peaks: the highest over ranks
    alloc_peak_gb double precision,
    reserved_peak_gb double precision,
    gpu_util_pct  double precision,     -- means
    cpu_util_pct  double precision,
    comm_ms       double precision,
    comm_exposed_ms double precision,
    tflops        double precision,
    mfu           double precision,
    -- The GPU samples of the run (store.GPUSampleStats) in the steady
    -- window, and over the whole run when none fell in it, as they were
    -- when gpu_minutes counted gpu_stamp samples of the run: a reader
    -- that counts more reads the samples again.
    gpu_stamp     bigint,
    gpu_window    jsonb,
    gpu_run       jsonb,
    -- A finished run's wasted GPU-hours (store.Wasted), which hold with
    -- its rollups and GPU samples as they were.
    wasted        jsonb
);

-- The refresher's list of summaries to recompute.
CREATE INDEX run_summaries_stale ON run_summaries (stale_since) WHERE summary_gen <> rollup_gen;
