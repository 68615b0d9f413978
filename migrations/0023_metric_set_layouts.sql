-- A set names its metrics by layout: the metrics of a layout are kept once,
-- in metric_set_layouts, instead of in every set (a fifth of a set's bytes,
-- the same few lists over and over). A set's counts are integers: a bucket
-- of one rank holds at most as many steps as its width (10,000 at most).
--
-- metric_set_layout(names) gives the layout of a list of names, adding it
-- when none has it. It is called inside the refresher's transactions, so
-- a layout added by one that aborts goes with the sets that used it. There
-- is no unique constraint on the lists: a transaction adding a layout
-- never waits for another adding the same one, which may then be there
-- twice, under two numbers; each is valid and both say the same.
--
-- A server older than this migration cannot refresh rollups any more (it
-- writes the metrics column): stop the old servers' query roles when the
-- first new server starts.
CREATE TABLE metric_set_layouts (
    layout  integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    metrics text[] NOT NULL
);
CREATE INDEX metric_set_layouts_metrics ON metric_set_layouts (metrics);

CREATE FUNCTION metric_set_layout(names text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    id integer;
BEGIN
    SELECT layout INTO id FROM metric_set_layouts WHERE metrics = names ORDER BY layout LIMIT 1;
    IF NOT FOUND THEN
        INSERT INTO metric_set_layouts (metrics) VALUES (names) RETURNING layout INTO id;
    END IF;
    RETURN id;
END
$$;

DROP VIEW metric_rollups;

INSERT INTO metric_set_layouts (metrics) SELECT DISTINCT metrics FROM metric_rollup_sets ORDER BY 1;
ALTER TABLE metric_rollup_sets ADD COLUMN layout integer;
UPDATE metric_rollup_sets s SET layout = l.layout FROM metric_set_layouts l WHERE l.metrics = s.metrics;
ALTER TABLE metric_rollup_sets
    DROP COLUMN metrics,
    ALTER COLUMN layout SET NOT NULL,
    ALTER COLUMN counts TYPE integer[];

CREATE VIEW metric_rollups AS
SELECT run_id, rank, width, bucket, metric, first_step, first_time, last_time, min, max, sum, count
FROM metric_rollup_rows
UNION ALL
SELECT s.run_id, s.rank, s.width, s.bucket, m.metric, coalesce(s.first_step, m.first_step),
       CASE WHEN s.first_step IS NULL THEN m.first_time ELSE s.first_time END,
       CASE WHEN s.first_step IS NULL THEN m.last_time ELSE s.last_time END, m.min, m.max, m.sum, m.count::bigint
FROM metric_rollup_sets s JOIN metric_set_layouts l ON l.layout = s.layout,
     unnest(l.metrics, s.first_steps, s.first_times, s.last_times, s.mins, s.maxs, s.sums, s.counts)
         AS m(metric, first_step, first_time, last_time, min, max, sum, count);
