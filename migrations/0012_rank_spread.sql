-- Rollups across the ranks of a run, so that no view of a run of a
-- thousand ranks reads every rank's rows (docs/scale.md).
--
-- metric_spread holds, per run, metric, width and bucket, the aggregate
-- over every rank's rows (min, max, sum, count: the whole run's figures)
-- and the spread of the ranks' means over the bucket (min, p5, median,
-- p95, max, and the rank with the largest mean): the distribution a fleet
-- chart draws instead of a line per rank. The rollup refresher writes it
-- from metric_rollups whenever it refreshes a block, in the same
-- transaction.
CREATE TABLE metric_spread (
    run_id     text NOT NULL,
    metric     text NOT NULL,
    width      integer NOT NULL,
    bucket     bigint NOT NULL,
    first_step bigint NOT NULL,
    first_time timestamptz NOT NULL,
    last_time  timestamptz,
    min        double precision,
    max        double precision,
    sum        double precision,
    count      bigint NOT NULL,
    ranks      integer NOT NULL,
    mean_min   double precision,
    mean_p5    double precision,
    mean_p50   double precision,
    mean_p95   double precision,
    mean_max   double precision,
    max_rank   integer,
    PRIMARY KEY (run_id, metric, width, bucket)
);

-- When a bucket's last step ended, so that rates over a span need no raw
-- rows. Width 0 (bucket 0) is new too: a rank's whole run, so that a view
-- of a thousand ranks reads one row per rank and metric.
ALTER TABLE metric_rollups ADD COLUMN last_time timestamptz;

-- A rank's rollups of one width together (its total sums its width-10,000
-- rows), and every rank's rollups of one bucket together (the spread reads
-- them a bucket at a time).
ALTER TABLE metric_rollups DROP CONSTRAINT metric_rollups_pkey;
ALTER TABLE metric_rollups ADD PRIMARY KEY (run_id, rank, width, metric, bucket);
CREATE INDEX metric_rollups_bucket ON metric_rollups (run_id, width, bucket, metric);

-- Rollups of runs written before this migration lack the cross-rank
-- metrics (lateness_ms, busy_ms, straggler_wait_ms, last_arrival) and the
-- spread: mark their blocks so that the refresher computes them.
INSERT INTO rollup_dirty (run_id, rank, block)
SELECT DISTINCT run_id, rank, bucket FROM metric_rollups WHERE width = 100
ON CONFLICT DO NOTHING;

-- The idle GPU time of a run reads its idle samples only (utilisation
-- under the detectors' default of 10 %), not every sample: a healthy run
-- has next to none, so the index costs ingest next to nothing.
CREATE INDEX gpu_samples_idle ON gpu_samples (run_id, time) WHERE run_id <> '' AND util_pct < 10;
