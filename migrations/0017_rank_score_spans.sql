-- Straggler scores kept as changes (docs/decisions/0013-straggler-scores-as-spans.md).
--
-- rank_scores held a row per rank and scored step, more than the steps it
-- summarises. It becomes two tables:
--
--   rank_score_heads  one row per rank: the exact newest score, with the
--                     lateness, busy time and wait it came from (what the
--                     evaluator continues, what GET /runs/{id}/ranks and
--                     the straggler alert show);
--   rank_score_spans  runs of consecutive scored steps of a rank over which
--                     the score stays within the tolerance of
--                     store.ScoreEpsilon: max - min <= 0.001 · max(1, |min|,
--                     |max|). A span keeps its first and last step, time and
--                     score, and the min, max and sum of its scores, so a
--                     bucket that holds it whole is exact and one that cuts
--                     it is within the tolerance.
--
-- A span's last step and score are those of the rank's head when it is
-- the rank's newest span.
CREATE TABLE rank_score_heads (
    run_id      text NOT NULL,
    rank        integer NOT NULL,
    step        bigint NOT NULL,
    time        timestamptz NOT NULL,
    lateness_ms double precision,
    busy_ms     double precision,
    wait_ms     double precision,
    score       double precision NOT NULL,
    PRIMARY KEY (run_id, rank)
) WITH (fillfactor = 50);

CREATE TABLE rank_score_spans (
    run_id      text NOT NULL,
    rank        integer NOT NULL,
    first_step  bigint NOT NULL,
    last_step   bigint NOT NULL,
    first_time  timestamptz NOT NULL,
    last_time   timestamptz NOT NULL,
    first_score double precision NOT NULL,
    last_score  double precision NOT NULL,
    min_score   double precision NOT NULL,
    max_score   double precision NOT NULL,
    sum_score   double precision NOT NULL,
    PRIMARY KEY (run_id, rank, first_step)
);

INSERT INTO rank_score_heads (run_id, rank, step, time, lateness_ms, busy_ms, wait_ms, score)
SELECT DISTINCT ON (run_id, rank) run_id, rank, step, time, lateness_ms, busy_ms, wait_ms, score
FROM rank_scores ORDER BY run_id, rank, step DESC;

-- The same fold as store.foldScores, row by row in step order: a score
-- joins the rank's open span when its step follows the span's last one
-- and the span's range with it stays within the tolerance (a non-finite
-- score only joins a span of the same value).
DO $$
DECLARE
    r   record;
    sp  rank_score_spans%ROWTYPE;
    lo  double precision;
    hi  double precision;
    fin boolean;
BEGIN
    sp.run_id := NULL;
    FOR r IN SELECT run_id, rank, step, time, score FROM rank_scores ORDER BY run_id, rank, step LOOP
        IF sp.run_id IS NOT NULL AND sp.run_id = r.run_id AND sp.rank = r.rank AND r.step = sp.last_step + 1 THEN
            lo := least(sp.min_score, r.score);
            hi := greatest(sp.max_score, r.score);
            fin := r.score NOT IN ('NaN', 'Infinity', '-Infinity')
               AND sp.min_score NOT IN ('NaN', 'Infinity', '-Infinity')
               AND sp.max_score NOT IN ('NaN', 'Infinity', '-Infinity');
            IF (fin AND hi - lo <= 0.001::float8 * greatest(1::float8, abs(lo), abs(hi)))
               OR (NOT fin AND r.score = sp.min_score AND r.score = sp.max_score) THEN
                sp.last_step := r.step;
                sp.last_time := r.time;
                sp.last_score := r.score;
                sp.min_score := lo;
                sp.max_score := hi;
                sp.sum_score := sp.sum_score + r.score;
                CONTINUE;
            END IF;
        END IF;
        IF sp.run_id IS NOT NULL THEN
            INSERT INTO rank_score_spans VALUES (sp.*);
        END IF;
        sp.run_id := r.run_id;
        sp.rank := r.rank;
        sp.first_step := r.step;
        sp.last_step := r.step;
        sp.first_time := r.time;
        sp.last_time := r.time;
        sp.first_score := r.score;
        sp.last_score := r.score;
        sp.min_score := r.score;
        sp.max_score := r.score;
        sp.sum_score := r.score;
    END LOOP;
    IF sp.run_id IS NOT NULL THEN
        INSERT INTO rank_score_spans VALUES (sp.*);
    END IF;
END
$$;

DROP TABLE rank_scores;
