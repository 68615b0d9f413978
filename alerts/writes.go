package alerts

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/deepseed/deepseed/detect"
	"github.com/deepseed/deepseed/store"
)

// reconcile makes the run's open alerts what fires (see
// [store.Store.ReconcileAlerts]).
func reconcile(ctx context.Context, st *store.Store, runID string, fs []detect.Firing) error {
	if err := st.ReconcileAlerts(ctx, runID, fs); err != nil {
		return fmt.Errorf("alerts: %w", err)
	}
	return nil
}

// scoreRanks scores the steps every rank reported among the newest ones,
// continuing each rank's EWMA from the last stored score when that step
// is still among them, stores the new scores (store.AddRankScores) and returns
// each rank's newest score and how many steps were scored to get it.
func scoreRanks(ctx context.Context, st *store.Store, runID string, byRank map[int][]detect.StepRow, cfg detect.Config) (map[int]detect.RankScore, int, error) {
	steps := detect.SyncSteps(byRank, cfg.Window)
	stored, err := st.LastRankScores(ctx, runID)
	if err != nil {
		return nil, 0, fmt.Errorf("alerts: %w", err)
	}
	last := map[int]detect.RankScore{}
	for _, r := range stored {
		last[r.Rank] = detect.RankScore{Rank: r.Rank, Step: r.Step, Time: r.Time,
			Late: orNaN(r.Late), Busy: orNaN(r.Busy), Wait: orNaN(r.Wait), Score: r.Score}
	}
	var lastStep int64 = -1
	prev := map[int]float64{}
	for r, s := range last {
		lastStep = s.Step
		prev[r] = s.Score
	}
	// Continue the stored series only when its step is in the window;
	// otherwise the evaluator fell behind (or restarted) and starts over.
	cont := len(last) > 0 && len(steps) > 0 && steps[0].Step <= lastStep
	scored := len(steps)
	if cont {
		i := slices.IndexFunc(steps, func(x detect.SyncStep) bool { return x.Step > lastStep })
		if i < 0 {
			steps = nil
		} else {
			steps = steps[i:]
		}
		scored = detect.MinScored // a stored series was scored before
	} else {
		prev = nil
		if len(steps) < detect.MinScored {
			return nil, 0, nil // a series starts with enough steps to fire on
		}
	}
	fresh := detect.StragglerScores(steps, cfg.StragglerAlpha, prev)
	newest := map[int]detect.RankScore{}
	if cont {
		for r, s := range last {
			newest[r] = s
		}
	}
	for _, s := range fresh {
		newest[s.Rank] = s
	}
	if len(fresh) == 0 {
		if !cont {
			return nil, 0, nil
		}
		return newest, scored, nil
	}
	rows := make([]store.RankScore, len(fresh))
	for i, s := range fresh {
		rows[i] = store.RankScore{Rank: s.Rank, Step: s.Step, Time: s.Time,
			Late: nanNil(s.Late), Busy: nanNil(s.Busy), Wait: nanNil(s.Wait), Score: s.Score}
	}
	if err := st.AddRankScores(ctx, runID, rows); err != nil {
		return nil, 0, fmt.Errorf("alerts: %w", err)
	}
	return newest, scored, nil
}

func orNaN(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

func nanNil(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}
