-- A set whose metrics all begin at the same step and time and end at the
-- same time (every set of width 100, and most coarser ones) keeps them
-- once, in first_step, first_time and last_time, and leaves the arrays of
-- them NULL: they were a third of its bytes. A set whose metrics differ
-- keeps the arrays, and the three columns NULL.
ALTER TABLE metric_rollup_sets
    ADD COLUMN first_step bigint,
    ADD COLUMN first_time timestamptz,
    ADD COLUMN last_time  timestamptz,
    ALTER COLUMN first_steps DROP NOT NULL,
    ALTER COLUMN first_times DROP NOT NULL,
    ALTER COLUMN last_times DROP NOT NULL,
    ADD CONSTRAINT metric_rollup_sets_bounds CHECK ((first_steps IS NULL) = (first_step IS NOT NULL));

CREATE OR REPLACE VIEW metric_rollups AS
SELECT run_id, rank, width, bucket, metric, first_step, first_time, last_time, min, max, sum, count
FROM metric_rollup_rows
UNION ALL
SELECT s.run_id, s.rank, s.width, s.bucket, m.metric, coalesce(s.first_step, m.first_step),
       CASE WHEN s.first_step IS NULL THEN m.first_time ELSE s.first_time END,
       CASE WHEN s.first_step IS NULL THEN m.last_time ELSE s.last_time END, m.min, m.max, m.sum, m.count
FROM metric_rollup_sets s,
     unnest(s.metrics, s.first_steps, s.first_times, s.last_times, s.mins, s.maxs, s.sums, s.counts)
         AS m(metric, first_step, first_time, last_time, min, max, sum, count);

-- The sets written so far, where their metrics agree.
UPDATE metric_rollup_sets
SET first_step = first_steps[1], first_time = first_times[1], last_time = last_times[1],
    first_steps = NULL, first_times = NULL, last_times = NULL
WHERE (SELECT count(DISTINCT (f, a, l)) FROM unnest(first_steps, first_times, last_times) AS u(f, a, l)) = 1;
