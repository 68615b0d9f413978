package store

import (
	"context"
	"fmt"
	"time"
)

// The step time of one rank of each of many runs from a first step on:
// what the finish estimates of the running runs of a page of summaries
// read, a few statements for the whole page.

// RankFrom names one rank of a run and a first step.
type RankFrom struct {
	RunID string
	Rank  int
	From  int64
}

// rankFromArrays splits runs into the arrays a statement takes.
func rankFromArrays(runs []RankFrom) (ids []string, ranks []int, from []int64) {
	ids, ranks, from = make([]string, len(runs)), make([]int, len(runs)), make([]int64, len(runs))
	for i, r := range runs {
		ids[i], ranks[i], from[i] = r.RunID, r.Rank, r.From
	}
	return ids, ranks, from
}

// LowestRanks returns the lowest rank of each of runIDs, the first of
// [Store.RunRanks] (from the same indexes); a run without ranks has no
// entry.
func (s *Store) LowestRanks(ctx context.Context, runIDs []string) (map[string]int, error) {
	first := func(table string) string {
		return `(SELECT rank FROM ` + table + ` WHERE run_id = x.run_id ORDER BY rank LIMIT 1)`
	}
	rows, err := s.pool.Query(ctx, `SELECT x.run_id, least(`+first("metric_rollup_rows")+`, `+first("metric_rollup_sets")+`, `+first("layer_rollups")+`, `+first("rollup_dirty")+`)
		FROM unnest($1::text[]) AS x(run_id)`, runIDs)
	if err != nil {
		return nil, fmt.Errorf("store: lowest ranks of %s: %w", runsWhat(runIDs), err)
	}
	defer rows.Close()
	out := make(map[string]int, len(runIDs))
	for rows.Next() {
		var id string
		var rank *int
		if err := rows.Scan(&id, &rank); err != nil {
			return nil, fmt.Errorf("store: lowest ranks of %s: %w", runsWhat(runIDs), err)
		}
		if rank != nil {
			out[id] = *rank
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: lowest ranks of %s: %w", runsWhat(runIDs), err)
	}
	return out, nil
}

// StepTimesFrom returns, keyed by run, the rows, span and mean step time
// of one rank of each run over its steps from From on: for raw, what
// [Store.SteadyByRank] of that rank holds of them, from the raw rows; for
// rolled, what [Store.RankRollups] of that rank does, from the rollups. A
// rank without steps there has no entry.
func (s *Store) StepTimesFrom(ctx context.Context, raw, rolled []RankFrom) (map[string]SteadyRank, error) {
	out := make(map[string]SteadyRank, len(raw)+len(rolled))
	if len(raw) > 0 {
		ids, ranks, from := rankFromArrays(raw)
		rows, err := s.pool.Query(ctx, `
			SELECT x.run_id, x.rank, a.n, a.first_step, a.last_step, a.first_time, a.last_time, a.step_ms
			FROM unnest($1::text[], $2::int[], $3::bigint[]) AS x(run_id, rank, from_step)
			CROSS JOIN LATERAL (
				SELECT count(*) AS n, min(step) AS first_step, max(step) AS last_step, min(time) AS first_time, max(time) AS last_time,
				       avg(step_ms) AS step_ms
				FROM steps WHERE run_id = x.run_id AND rank = x.rank AND step >= x.from_step
			) a WHERE a.n > 0`, ids, ranks, from)
		if err != nil {
			return nil, fmt.Errorf("store: step times of %s: %w", runsWhat(ids), err)
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			var a SteadyRank
			if err := rows.Scan(&id, &a.Rank, &a.Rows, &a.FirstStep, &a.LastStep, &a.FirstTime, &a.LastTime, &a.StepMS); err != nil {
				return nil, fmt.Errorf("store: step times of %s: %w", runsWhat(ids), err)
			}
			out[id] = a
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("store: step times of %s: %w", runsWhat(ids), err)
		}
		rows.Close()
	}
	if len(rolled) == 0 {
		return out, nil
	}
	ids, ranks, from := rankFromArrays(rolled)
	for i := range from {
		from[i] = max(from[i], 0) / 100 * 100
	}
	// rankRollupSQL's figures of the steps and their times, for one rank
	// of each run.
	rows, err := s.pool.Query(ctx, `
		WITH x AS (
			SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[]) AS x(run_id, rank, from_step)
		), t AS (
			SELECT x.run_id, x.rank, x.from_step, m.* FROM x CROSS JOIN LATERAL (
				SELECT metric, first_step, first_time, last_time, max, sum, count FROM metric_rollup_rows
				WHERE run_id = x.run_id AND rank = x.rank AND width = 0 AND bucket = 0 AND metric IN ('step', 'step_ms') OFFSET 0
			) m
		), p AS (
			SELECT x.run_id, m.* FROM x CROSS JOIN LATERAL (
				SELECT metric, sum(sum) AS sum, sum(count)::bigint AS count, max(last_time) AS last_time FROM metric_rollups
				WHERE run_id = x.run_id AND rank = x.rank AND metric IN ('step', 'step_ms') AND x.from_step > 0 AND `+blocksBefore("x.from_step")+`
				GROUP BY metric
			) m
		)
		SELECT t.run_id, t.rank, t.from_step, t.metric, t.first_step, t.first_time, t.last_time, t.max,
		       t.sum - coalesce(p.sum, 0), t.count - coalesce(p.count, 0), p.last_time
		FROM t LEFT JOIN p USING (run_id, metric)`, ids, ranks, from)
	if err != nil {
		return nil, fmt.Errorf("store: step times of %s: %w", runsWhat(ids), err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, metric string
		var rank int
		var from, firstStep, n int64
		var firstTime time.Time
		var lastTime, prefixLast *time.Time
		var mx, sum *float64
		if err := rows.Scan(&id, &rank, &from, &metric, &firstStep, &firstTime, &lastTime, &mx, &sum, &n, &prefixLast); err != nil {
			return nil, fmt.Errorf("store: step times of %s: %w", runsWhat(ids), err)
		}
		a, ok := out[id]
		if !ok {
			a.Rank = rank
		}
		switch metric {
		case "step":
			a.setSpan(n, from, firstStep, firstTime, lastTime, prefixLast, mx)
		case "step_ms":
			if n > 0 {
				v := 0.0
				if sum != nil {
					v = *sum
				}
				v /= float64(n)
				a.StepMS = &v
			}
		}
		out[id] = a
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: step times of %s: %w", runsWhat(ids), err)
	}
	return out, nil
}
