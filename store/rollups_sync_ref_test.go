package store

// syncRollupRefSQL is the definition the Go fold of rollups_sync.go is
// held to: the synchronisation figures of GET /runs/{id}/ranks
// (ranks_series.go) with clock offsets block by block, as one SQL
// statement over the ranks $3 of run $1 in the blocks $2, returning the
// rows metric_rollups gets. A step counts when every rank reported it.
// It is what the refresh ran before the fold, with enable_nestloop off so
// that its plan did not depend on the statistics of steps.
var syncRollupRefSQL = `
WITH ranks AS (
	SELECT unnest($3::int[]) AS rank
), s AS (
	SELECT DISTINCT ON (s.rank, s.step) s.rank, s.step, s.time, s.sync_ns::float8 / 1e6 AS a, s.sync_wait_ms AS w, s.step_ms, s.input_wait_ms
	FROM ranks r CROSS JOIN unnest($2::bigint[]) AS b(block) CROSS JOIN LATERAL (
		SELECT r.rank, step, time, sync_ns, sync_wait_ms, step_ms, input_wait_ms FROM steps
		WHERE run_id = $1 AND rank = r.rank AND step >= b.block * 100 AND step < (b.block + 1) * 100
		OFFSET 0
	) s
	ORDER BY s.rank, s.step, s.time DESC
), c AS (
	SELECT * FROM (
		SELECT s.*, count(*) OVER st AS nr, count(a) OVER st AS na, count(w) OVER st AS nw FROM s WINDOW st AS (PARTITION BY step)
	) x WHERE nr = (SELECT count(*) FROM ranks) AND nr >= 2
), ` + clockOffsets("c", perBlock) + `, ` + lateness("c", perBlock) + `, m AS (
	SELECT *, max(late) OVER (PARTITION BY step) AS latest FROM l
)
SELECT $1, rank, 100, step / 100, v.metric, min(step), (array_agg(time ORDER BY step))[1], max(time), min(v.x), max(v.x), sum(v.x), count(v.x)
FROM m, LATERAL (VALUES ('lateness_ms', late), ('busy_ms', busy), ('straggler_wait_ms', excess),
	('last_arrival', CASE WHEN late IS NULL THEN NULL WHEN late = latest AND latest > 0 THEN 1.0 ELSE 0.0 END)) AS v(metric, x)
GROUP BY rank, step / 100, v.metric HAVING count(v.x) > 0
ORDER BY 2, 4, 5`
