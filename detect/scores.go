package detect

import (
	"math"
	"slices"
	"time"

	"github.com/deepseed/deepseed/internal/stats"
)

// The straggler scores of a run the evaluator never scored (finished
// before a server watched it, or imported), computed on read by the
// evaluator's definition: the query server reads the rows through the
// store and calls these.

// ScorePoint is one rank's straggler score after a step, or after a block
// of steps when computed from rollups.
type ScorePoint struct {
	Rank  int
	Step  int64
	Time  time.Time
	Score float64
}

// FinalScores computes each rank's straggler score as the evaluator
// would have it at the run's last step, from each rank's newest steps
// (newest first, as ByRank groups the store's RecentSteps read with
// cfg.Window steps a rank): the same EWMA of lateness over the step's
// median busy time, folded over each rank's newest cfg.Window steps, cfg
// being the run's (Config.WithMeta) as for the evaluator. A finished or
// imported run was never scored live; this gives it the score a user
// would have seen at its end. The EWMA starts at the window's first step
// instead of the run's: with the default weight and window the steps
// before it would count for less than one part in two hundred
// ((1 − 0.1)^50). Nil when the run has fewer than two ranks or fewer
// scored steps than the detector needs.
func FinalScores(byRank map[int][]StepRow, cfg Config) map[int]float64 {
	steps := SyncSteps(byRank, cfg.Window)
	if len(steps) < MinScored {
		return nil
	}
	out := map[int]float64{}
	// Oldest first: each rank's last score is its newest.
	for _, s := range StragglerScores(steps, cfg.StragglerAlpha, nil) {
		out[s.Rank] = s.Score
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// ScoreSeries computes every rank's straggler score at each of the steps
// given (each rank's, newest first, as ByRank groups them), as the
// evaluator scores a live run: the EWMA of lateness over the step's
// median busy time, cfg being the run's (Config.WithMeta). Its work grows
// with ranks × steps, so the caller bounds what it reads (BlockScores
// takes rollups instead). Oldest first; nil for fewer than two ranks.
func ScoreSeries(byRank map[int][]StepRow, cfg Config) []ScorePoint {
	return ScoreSeriesAfter(byRank, cfg, -1, nil)
}

// ScoreSeriesAfter is ScoreSeries of the steps after step after alone,
// each rank's EWMA continued from prev (its score at step after, as the
// evaluator stored it): what the evaluator's next pass stores for them,
// the steps up to after giving their cross-rank figures the context the
// evaluator's window gives them.
func ScoreSeriesAfter(byRank map[int][]StepRow, cfg Config, after int64, prev map[int]float64) []ScorePoint {
	n := 0
	for _, rows := range byRank {
		n = max(n, len(rows))
	}
	steps := SyncSteps(byRank, n)
	i := slices.IndexFunc(steps, func(x SyncStep) bool { return x.Step > after })
	if i < 0 {
		return nil
	}
	var out []ScorePoint
	for _, s := range StragglerScores(steps[i:], cfg.StragglerAlpha, prev) {
		out = append(out, ScorePoint{Rank: s.Rank, Step: s.Step, Time: s.Time, Score: s.Score})
	}
	return out
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
// time; cfg is the run's (Config.WithMeta). The work is a few numbers a
// rank a block, whatever the steps.
func BlockScores(blocks []ScoreBlock, cfg Config) []ScorePoint {
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
