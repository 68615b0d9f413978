package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The evals table: evaluations per run, split and step.

// EvalRow is one evaluation with the training loss at its step.
type EvalRow struct {
	Step      int64
	Time      time.Time
	Split     string
	Loss      *float64
	Accuracy  *float64
	F1        *float64
	Metrics   []byte
	TrainLoss *float64
}

// Evals returns a run's evaluations in step order, each with the loss of
// the lowest rank at its step or the last step before it.
//
// The training losses are read in one pass over the evaluations' steps
// rather than one lookup per evaluation: on TimescaleDB each lookup would
// decompress a batch of the compressed chunk again, and even on plain
// PostgreSQL a thousand lookups cost a thousand index descents.
func (s *Store) Evals(ctx context.Context, runID string) ([]EvalRow, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT step, time, split, loss, accuracy, f1, metrics
		FROM evals WHERE run_id = $1 ORDER BY step, split, time`, runID)
	if err != nil {
		return nil, fmt.Errorf("store: evals of %s: %w", runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (EvalRow, error) {
		var e EvalRow
		err := r.Scan(&e.Step, &e.Time, &e.Split, &e.Loss, &e.Accuracy, &e.F1, &e.Metrics)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: evals of %s: %w", runID, err)
	}
	if len(out) == 0 {
		return out, nil
	}
	if err := s.pairTrainLoss(ctx, runID, out); err != nil {
		return nil, fmt.Errorf("store: evals of %s: %w", runID, err)
	}
	return out, nil
}

// pairTrainLoss sets each evaluation's TrainLoss: the newest loss of the
// run's lowest rank at the evaluation's step, or at the last step before
// it that has one. evals are in step order.
func (s *Store) pairTrainLoss(ctx context.Context, runID string, evals []EvalRow) error {
	// The lowest rank from the rollup tables: reading it off the steps
	// decompresses a batch of every rank's on compressed chunks.
	ranks, err := s.RunRanks(ctx, runID)
	if err != nil {
		return fmt.Errorf("lowest rank: %w", err)
	}
	if len(ranks) == 0 {
		return nil
	}
	rank := ranks[0]
	var steps []int64
	for i, e := range evals {
		if i == 0 || e.Step != evals[i-1].Step {
			steps = append(steps, e.Step)
		}
	}
	// The bounds are constants for TimescaleDB to skip compressed batches
	// outside them.
	rows, err := s.pool.Query(ctx, `
		SELECT DISTINCT ON (step) step, loss FROM steps
		WHERE run_id = $1 AND rank = $2 AND step = ANY($3) AND step BETWEEN $4 AND $5 AND loss IS NOT NULL
		ORDER BY step, time DESC`, runID, rank, steps, steps[0], steps[len(steps)-1])
	if err != nil {
		return fmt.Errorf("training loss: %w", err)
	}
	loss := map[int64]float64{}
	var step int64
	var v float64
	if _, err := pgx.ForEachRow(rows, []any{&step, &v}, func() error {
		loss[step] = v
		return nil
	}); err != nil {
		return fmt.Errorf("training loss: %w", err)
	}
	// Evaluations between steps (or at a step without a loss) take the
	// last loss before them, looked up one by one: there are few.
	var missing []int64
	for _, st := range steps {
		if _, ok := loss[st]; !ok {
			missing = append(missing, st)
		}
	}
	if len(missing) > 0 {
		rows, err := s.pool.Query(ctx, `
			SELECT m.step, (SELECT s.loss FROM steps s
				WHERE s.run_id = $1 AND s.rank = $2 AND s.step <= m.step AND s.loss IS NOT NULL
				ORDER BY s.step DESC, s.time DESC LIMIT 1)
			FROM unnest($3::bigint[]) AS m(step)`, runID, rank, missing)
		if err != nil {
			return fmt.Errorf("training loss before evaluations: %w", err)
		}
		var before *float64
		if _, err := pgx.ForEachRow(rows, []any{&step, &before}, func() error {
			if before != nil {
				loss[step] = *before
			}
			return nil
		}); err != nil {
			return fmt.Errorf("training loss before evaluations: %w", err)
		}
	}
	for i := range evals {
		if l, ok := loss[evals[i].Step]; ok {
			evals[i].TrainLoss = &l
		}
	}
	return nil
}

// EvalEvents returns evaluations of runID (empty: every run) in [from, to]
// as annotations need them.
func (s *Store) EvalEvents(ctx context.Context, runID string, from, to time.Time, limit int) ([]EvalRow, []string, error) {
	rows, err := s.pool.Query(ctx, `SELECT run_id, step, time, split, loss, accuracy, f1 FROM evals
		WHERE ($1 = '' OR run_id = $1) AND time >= $2 AND time <= $3 ORDER BY time, run_id LIMIT $4`, runID, from, to, limit)
	if err != nil {
		return nil, nil, fmt.Errorf("store: eval annotations: %w", err)
	}
	defer rows.Close()
	var out []EvalRow
	var ids []string
	for rows.Next() {
		var e EvalRow
		var id string
		if err := rows.Scan(&id, &e.Step, &e.Time, &e.Split, &e.Loss, &e.Accuracy, &e.F1); err != nil {
			return nil, nil, fmt.Errorf("store: eval annotations: %w", err)
		}
		out = append(out, e)
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("store: eval annotations: %w", err)
	}
	return out, ids, nil
}

var evalCols = []string{"run_id", "step", "time", "split", "loss", "accuracy", "f1", "metrics"}

func (b *batchPlan) evalRow(i int, r []any) []any {
	e := b.evals[i]
	return append(r, e.RunID, *e.Step, e.Time.Time, orDefault(e.Split, "val"), f(e.Loss), f(e.Accuracy), f(e.F1),
		jsonValue(e.Metrics, len(e.Metrics) == 0))
}

// mergeEvals is the merge of evals (mergeNewest), keyed by run, split and
// step; evaluations have no rollups to mark.
var mergeEvals = mergeNewest("evals", "split", false)

// EvalStats are the best and final evaluation figures of a run's split.
type EvalStats struct {
	BestAcc, FinalAcc, BestF1, FinalF1, FinalLoss *float64
}

// EvalStats returns figures of the "val" split, or of any split when the
// run has no "val" evaluations.
func (s *Store) EvalStats(ctx context.Context, runID string) (*EvalStats, error) {
	m, err := s.EvalStatsOf(ctx, []string{runID})
	if err != nil {
		return nil, err
	}
	return m[runID], nil
}

// EvalStatsOf is [Store.EvalStats] of each of runIDs, in one statement.
// Every id has an entry.
func (s *Store) EvalStatsOf(ctx context.Context, runIDs []string) (map[string]*EvalStats, error) {
	const e = `FROM evals WHERE run_id = x.run_id AND (split = 'val' OR NOT x.val)`
	rows, err := s.pool.Query(ctx, `
		SELECT x.run_id,
		       (SELECT max(accuracy) FILTER (WHERE accuracy <> 'NaN') `+e+`),
		       (SELECT accuracy `+e+` AND accuracy IS NOT NULL ORDER BY step DESC, time DESC LIMIT 1),
		       (SELECT max(f1) FILTER (WHERE f1 <> 'NaN') `+e+`),
		       (SELECT f1 `+e+` AND f1 IS NOT NULL ORDER BY step DESC, time DESC LIMIT 1),
		       (SELECT loss `+e+` AND loss IS NOT NULL ORDER BY step DESC, time DESC LIMIT 1)
		FROM (SELECT id AS run_id, EXISTS (SELECT 1 FROM evals WHERE run_id = id AND split = 'val') AS val
		      FROM unnest($1::text[]) AS id) x`, runIDs)
	if err != nil {
		return nil, fmt.Errorf("store: eval stats of %s: %w", runsWhat(runIDs), err)
	}
	defer rows.Close()
	out := make(map[string]*EvalStats, len(runIDs))
	for rows.Next() {
		var id string
		var e EvalStats
		if err := rows.Scan(&id, &e.BestAcc, &e.FinalAcc, &e.BestF1, &e.FinalF1, &e.FinalLoss); err != nil {
			return nil, fmt.Errorf("store: eval stats of %s: %w", runsWhat(runIDs), err)
		}
		out[id] = &e
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: eval stats of %s: %w", runsWhat(runIDs), err)
	}
	return out, nil
}
