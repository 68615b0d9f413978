-- The rollups of the metrics computed across ranks (lateness_ms, busy_ms,
-- straggler_wait_ms, last_arrival) join the built-in ones in
-- metric_rollup_sets, as a second set of each rank and bucket (part 1),
-- which their own pass of the refresher writes; part 0 holds the step
-- metrics. metric_rollup_rows keeps the user metrics and the whole-run rows.
ALTER TABLE metric_rollup_sets ADD COLUMN part smallint NOT NULL DEFAULT 0;
ALTER TABLE metric_rollup_sets DROP CONSTRAINT metric_rollup_sets_pkey;
ALTER TABLE metric_rollup_sets ADD PRIMARY KEY (run_id, rank, width, bucket, part);

WITH moved AS (
    DELETE FROM metric_rollup_rows
    WHERE width > 0 AND metric IN ('lateness_ms', 'busy_ms', 'straggler_wait_ms', 'last_arrival')
    RETURNING *
)
INSERT INTO metric_rollup_sets (run_id, rank, width, bucket, part, metrics, first_steps, first_times, last_times, mins, maxs, sums, counts)
SELECT run_id, rank, width, bucket, 1, array_agg(metric ORDER BY metric), array_agg(first_step ORDER BY metric),
       array_agg(first_time ORDER BY metric), array_agg(last_time ORDER BY metric), array_agg(min ORDER BY metric),
       array_agg(max ORDER BY metric), array_agg(sum ORDER BY metric), array_agg(count ORDER BY metric)
FROM moved GROUP BY run_id, rank, width, bucket;
