-- Pre-aggregated step and layer rollups, so that a chart of a
-- 1,000,000-step run reads a few thousand rows instead of a million.
--
-- Buckets are aligned: bucket b of width w covers steps [b*w, (b+1)*w).
-- Width 100 is computed from the raw rows of the blocks listed in
-- rollup_dirty (block = step / 100, so a block is exactly one width-100
-- bucket); widths 1,000 and 10,000 are recomputed from the width-100 rows
-- of the same span. The query service refreshes dirty blocks, in one
-- transaction per chunk, before it reads a run's rollups.

-- One row per run, rank, width, bucket and metric. Built-in metrics are
-- named after their steps column (loss, step_ms, …); user metrics are
-- named metrics.NAME. min/max/sum follow PostgreSQL float semantics (a NaN
-- makes the sum NaN and, NaN sorting above every number, the max NaN), so
-- an fp16 overflow stays visible after aggregation.
CREATE TABLE metric_rollups (
    run_id     text NOT NULL,
    rank       integer NOT NULL,
    width      integer NOT NULL,
    bucket     bigint NOT NULL,
    metric     text NOT NULL,
    first_step bigint NOT NULL, -- first step of the bucket holding the metric
    first_time timestamptz NOT NULL,
    min        double precision,
    max        double precision,
    sum        double precision,
    count      bigint NOT NULL,
    PRIMARY KEY (run_id, rank, metric, width, bucket)
);

-- One row per run, rank, width and bucket: per-layer sums and counts of
-- the forward and backward milliseconds, aligned with runs.layer_names.
-- A layer missing from a row (NULL) is not counted.
CREATE TABLE layer_rollups (
    run_id     text NOT NULL,
    rank       integer NOT NULL,
    width      integer NOT NULL,
    bucket     bigint NOT NULL,
    first_step bigint NOT NULL,
    first_time timestamptz NOT NULL,
    rows       bigint NOT NULL,
    fwd_sums   double precision[] NOT NULL,
    fwd_counts bigint[] NOT NULL,
    bwd_sums   double precision[] NOT NULL,
    bwd_counts bigint[] NOT NULL,
    PRIMARY KEY (run_id, rank, width, bucket)
);
