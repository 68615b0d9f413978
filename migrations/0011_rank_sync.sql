-- Per-rank truth under synchronous training (see docs/ranks.md).
--
-- sync_ns is when the rank reached the step's synchronisation point (the
-- end of its backward, where the gradient all-reduce waits for every
-- rank), in nanoseconds since the Unix epoch on the rank's host clock.
-- sync_wait_ms is how long it then waited in that collective before its
-- optimizer began; input_wait_ms is the part of the time between steps
-- its host spent blocked behind the device (an input copy queued behind
-- the previous step's all-reduce), no longer counted in data_ms. Nullable
-- without a default: adding them touches no existing row, compressed
-- chunks included.
ALTER TABLE steps ADD COLUMN sync_ns bigint;
ALTER TABLE steps ADD COLUMN sync_wait_ms double precision;
ALTER TABLE steps ADD COLUMN input_wait_ms double precision;

-- The straggler score of each rank as the alert evaluator computes it on
-- each pass (an EWMA over the newest steps of the rank's lateness as a
-- share of the step's median busy time), so a dashboard shows who
-- straggles and since when. One row per rank and scored step.
CREATE TABLE rank_scores (
    run_id      text NOT NULL,
    rank        integer NOT NULL,
    step        bigint NOT NULL,
    time        timestamptz NOT NULL,
    lateness_ms double precision,
    busy_ms     double precision,
    wait_ms     double precision,
    score       double precision NOT NULL,
    PRIMARY KEY (run_id, rank, step)
);
CREATE INDEX rank_scores_run_time ON rank_scores (run_id, time);
