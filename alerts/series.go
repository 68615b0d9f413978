package alerts

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/deepseed/deepseed/alerts/detect"
	"github.com/deepseed/deepseed/internal/stats"
	"github.com/deepseed/deepseed/store"
)

// ScorePoint is one rank's straggler score after a step, or after a block
// of steps when computed from rollups.
type ScorePoint struct {
	Rank  int
	Step  int64
	Time  time.Time
	Score float64
}

// ScoreSeries computes every rank's straggler score at each step in
// [from, to] from the run's stored steps, as the evaluator scores a live
// run (the EWMA of lateness over the step's median busy time, the run's
// meta overriding cfg): for a finished or imported run the evaluator
// never scored. It reads every rank's rows of the range, so the caller
// bounds ranks × steps (BlockScores reads rollups instead). Oldest first;
// nil for fewer than two ranks.
func ScoreSeries(ctx context.Context, st *store.Store, runID string, ranks []int, meta []byte, cfg detect.Config, from, to int64) ([]ScorePoint, error) {
	if len(ranks) < 2 || from > to {
		return nil, nil
	}
	cfg = cfg.WithMeta(meta)
	rows, err := st.SyncSteps(ctx, runID, ranks, from, to)
	if err != nil {
		return nil, fmt.Errorf("alerts: score series: %w", err)
	}
	byRank := map[int][]detect.StepRow{}
	n := 0
	for _, s := range rows {
		byRank[s.Rank] = append(byRank[s.Rank], detect.StepRow(s))
		n++
	}
	var out []ScorePoint
	for _, s := range detect.StragglerScores(detect.SyncSteps(byRank, n), cfg.StragglerAlpha, nil) {
		out = append(out, ScorePoint{Rank: s.Rank, Step: s.Step, Time: s.Time, Score: s.Score})
	}
	return out, nil
}

// ScoreBlock is one block of steps as the rollups give it: each rank's
// mean lateness and mean busy milliseconds over the block's steps.
type ScoreBlock struct {
	FirstStep int64
	FirstTime time.Time
	Steps     int64 // the block's width in steps
	Late      map[int]float64
	Busy      map[int]float64
}

// BlockScores folds blocks, oldest first, into each rank's straggler
// score after each block: the same EWMA as ScoreSeries, each block one
// update weighted as its steps would have been together (1 − (1 − α)^n),
// of the block's mean lateness over the median of the ranks' mean busy
// time. The work is a few numbers a rank a block, whatever the steps.
func BlockScores(blocks []ScoreBlock, meta []byte, cfg detect.Config) []ScorePoint {
	cfg = cfg.WithMeta(meta)
	ewma := map[int]float64{}
	var out []ScorePoint
	for _, b := range blocks {
		var busy []float64
		for _, v := range b.Busy {
			if !math.IsNaN(v) {
				busy = append(busy, v)
			}
		}
		med := stats.Median(busy)
		if len(busy) == 0 || !(med > 0) || len(b.Late) < 2 {
			continue
		}
		alpha := 1 - math.Pow(1-cfg.StragglerAlpha, float64(max(b.Steps, 1)))
		ranks := make([]int, 0, len(b.Late))
		for r := range b.Late {
			ranks = append(ranks, r)
		}
		slices.Sort(ranks)
		for _, r := range ranks {
			v := b.Late[r] / med
			if e, ok := ewma[r]; ok {
				v = alpha*v + (1-alpha)*e
			}
			ewma[r] = v
			out = append(out, ScorePoint{Rank: r, Step: b.FirstStep, Time: b.FirstTime, Score: v})
		}
	}
	return out
}
