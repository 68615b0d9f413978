package store

import (
	"context"
	"fmt"
)

// ConsistencyFacts is what the run invariants (query's consistency
// checks) read of one rank's newest steps: counts of the steps that break
// each invariant and the extremes seen. A bounded read: one rank's newest
// n rows through the steps' unique index.
type ConsistencyFacts struct {
	Rows int64 // steps read
	// MFU: steps above 1, steps at or below 0, the highest seen.
	MFUAbove1, MFUNonPositive int64
	MaxMFU                    *float64
	// Phases: steps where forward, backward or optimizer alone is longer
	// than the step (plus the tolerance), steps where their sum is, and
	// the largest sum over step ratio.
	PhaseOverStep, SumOverStep int64
	MaxSumRatio                *float64
	// Tokens: the smallest and largest a step carried, the steps that
	// carried them, and the steps carrying less than half the largest.
	MinTokens, MaxTokens *int64
	TokenSteps, Partial  int64
}

// Consistency reads the facts of rank's newest n steps; tolMS and tolPct
// are the tolerance of the phases against the step: a phase may exceed
// the step by tolMS, their sum by tolPct % of the step plus tolMS.
func (s *Store) Consistency(ctx context.Context, runID string, rank, n int, tolMS, tolPct float64) (ConsistencyFacts, error) {
	var f ConsistencyFacts
	err := s.pool.QueryRow(ctx, `
		WITH x AS (
			SELECT step_ms, forward_ms, backward_ms, optimizer_ms, mfu, tokens,
			       coalesce(forward_ms, 0) + coalesce(backward_ms, 0) + coalesce(optimizer_ms, 0) AS phases
			FROM steps WHERE run_id = $1 AND rank = $2 ORDER BY step DESC, time DESC LIMIT $3
		), y AS (SELECT *, max(tokens) OVER () AS tmax FROM x)
		SELECT count(*),
		       count(*) FILTER (WHERE mfu > 1), count(*) FILTER (WHERE mfu <= 0), max(mfu),
		       count(*) FILTER (WHERE step_ms > 0 AND greatest(forward_ms, backward_ms, optimizer_ms) > step_ms + $4),
		       count(*) FILTER (WHERE step_ms > 0 AND phases > step_ms * (1 + $5 / 100) + $4),
		       max(phases / step_ms) FILTER (WHERE step_ms > 0 AND phases > 0),
		       min(tokens), max(tokens), count(tokens), count(*) FILTER (WHERE tokens * 2 < tmax)
		FROM y`, runID, rank, n, tolMS, tolPct).Scan(&f.Rows, &f.MFUAbove1, &f.MFUNonPositive, &f.MaxMFU,
		&f.PhaseOverStep, &f.SumOverStep, &f.MaxSumRatio, &f.MinTokens, &f.MaxTokens, &f.TokenSteps, &f.Partial)
	if err != nil {
		return f, fmt.Errorf("store: consistency of %s rank %d: %w", runID, rank, err)
	}
	return f, nil
}
