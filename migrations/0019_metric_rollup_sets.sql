-- The built-in step metrics' rollups as one row a rank and bucket, with a
-- metric's figures at the same place in each array, instead of a row a
-- rank, bucket and metric. About twenty metrics shared a bucket, each row
-- with its own header, run id, rank, width, bucket and name, and an entry
-- in two indexes: at 1,024 ranks the rollups weighed 77 bytes a rank-step,
-- more than the compressed steps they summarise (docs/scale.md).
--
-- metric_rollup_rows (the old table) keeps the rows the refresher writes
-- by other passes: user metrics (metrics.NAME), the metrics computed across
-- ranks (SyncMetrics) and every metric's whole-run row (width 0).
-- metric_rollups is now a view of both, one row a rank, bucket and metric,
-- as before, so that what reads it is unchanged. A server older than this
-- migration cannot refresh rollups any more (it writes to the view): stop
-- the old servers' query roles when the first new server starts.
ALTER TABLE metric_rollups RENAME TO metric_rollup_rows;
ALTER INDEX metric_rollups_pkey RENAME TO metric_rollup_rows_pkey;
ALTER INDEX metric_rollups_bucket RENAME TO metric_rollup_rows_bucket;

CREATE TABLE metric_rollup_sets (
    run_id      text NOT NULL,
    rank        integer NOT NULL,
    width       integer NOT NULL CHECK (width > 0),
    bucket      bigint NOT NULL,
    metrics     text[] NOT NULL,
    first_steps bigint[] NOT NULL,
    first_times timestamptz[] NOT NULL,
    last_times  timestamptz[] NOT NULL,
    mins        double precision[] NOT NULL,
    maxs        double precision[] NOT NULL,
    sums        double precision[] NOT NULL,
    counts      bigint[] NOT NULL,
    PRIMARY KEY (run_id, rank, width, bucket)
);
CREATE INDEX metric_rollup_sets_bucket ON metric_rollup_sets (run_id, width, bucket);

-- The built-in metrics' rows move: every row of a bucket that is neither a
-- user metric, a metric across ranks, nor a whole-run row.
WITH moved AS (
    DELETE FROM metric_rollup_rows
    WHERE width > 0 AND metric NOT LIKE 'metrics.%'
      AND metric NOT IN ('lateness_ms', 'busy_ms', 'straggler_wait_ms', 'last_arrival')
    RETURNING *
)
INSERT INTO metric_rollup_sets (run_id, rank, width, bucket, metrics, first_steps, first_times, last_times, mins, maxs, sums, counts)
SELECT run_id, rank, width, bucket, array_agg(metric ORDER BY metric), array_agg(first_step ORDER BY metric),
       array_agg(first_time ORDER BY metric), array_agg(last_time ORDER BY metric), array_agg(min ORDER BY metric),
       array_agg(max ORDER BY metric), array_agg(sum ORDER BY metric), array_agg(count ORDER BY metric)
FROM moved GROUP BY run_id, rank, width, bucket;

CREATE VIEW metric_rollups AS
SELECT run_id, rank, width, bucket, metric, first_step, first_time, last_time, min, max, sum, count
FROM metric_rollup_rows
UNION ALL
SELECT s.run_id, s.rank, s.width, s.bucket, m.metric, m.first_step, m.first_time, m.last_time, m.min, m.max, m.sum, m.count
FROM metric_rollup_sets s,
     unnest(s.metrics, s.first_steps, s.first_times, s.last_times, s.mins, s.maxs, s.sums, s.counts)
         AS m(metric, first_step, first_time, last_time, min, max, sum, count);
