package alerts

import (
	"context"
	"fmt"

	"github.com/deepseed/deepseed/alerts/detect"
	"github.com/deepseed/deepseed/store"
)

// FinalScores computes each rank's straggler score as the evaluator
// would have it at the run's last step, from the run's stored steps: the
// same EWMA of lateness over the step's median busy time, folded over
// each rank's newest cfg.Window steps (the run's meta overriding cfg as
// for the evaluator). A finished or imported run was never scored live;
// this gives it the score a user would have seen at its end. The EWMA
// starts at the window's first step instead of the run's: with the
// default weight and window the steps before it would count for less
// than one part in two hundred ((1 − 0.1)^50). It reads a bounded number of rows a rank and writes
// nothing, so a query server on a standby can call it. Nil when the run
// has fewer than two ranks or fewer scored steps than the detector needs.
func FinalScores(ctx context.Context, st *store.Store, runID string, ranks []int, meta []byte, cfg detect.Config) (map[int]float64, error) {
	if len(ranks) < 2 {
		return nil, nil
	}
	cfg = cfg.WithMeta(meta)
	byRank, err := recentSteps(ctx, st, runID, ranks, cfg.Window)
	if err != nil {
		return nil, fmt.Errorf("alerts: final scores: %w", err)
	}
	steps := detect.SyncSteps(byRank, cfg.Window)
	if len(steps) < detect.MinScored {
		return nil, nil
	}
	out := map[int]float64{}
	// Oldest first: each rank's last score is its newest.
	for _, s := range detect.StragglerScores(steps, cfg.StragglerAlpha, nil) {
		out[s.Rank] = s.Score
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}
