package query

import (
	"context"
	"fmt"
	"math"

	"github.com/deepseed/deepseed/detect"
	"github.com/deepseed/deepseed/store"
)

// rankSeries serves the series of store.RankMetrics within one request:
// lateness (computed from every rank's arrivals with the clock offsets of
// GET /runs/{id}/ranks) and the stored straggler score. Both come for
// every rank at once, so each plan is read once and shared by the ranks.
type rankSeries struct {
	h       *Handler
	runID   string
	meta    []byte // the run's meta: its alert settings
	offsets *int64 // first step of the clock offset estimate, once known
	ranks   []int  // the run's ranks, once read
	cache   map[rankSeriesKey]map[int][]store.RankBucket
	// rowBudget is the most rank-steps computedScores reads row by row:
	// scoreRowBudget for a few ranks' lines, spreadRowBudget for the
	// distribution over the ranks, which reads every other metric of
	// that many rank-steps row by row too.
	rowBudget int64
}

type rankSeriesKey struct {
	metric          string
	from, to, width int64
}

func newRankSeries(h *Handler, r *store.RunRow) *rankSeries {
	return &rankSeries{h: h, runID: r.RunID, meta: r.Meta, cache: map[rankSeriesKey]map[int][]store.RankBucket{}, rowBudget: scoreRowBudget}
}

// buckets returns one rank's buckets of metric over the plan.
func (rs *rankSeries) buckets(ctx context.Context, rank int, metric string, p plan) (*buckets, error) {
	k := rankSeriesKey{metric, p.From, p.To, p.Width}
	byRank, ok := rs.cache[k]
	if !ok {
		var rows []store.RankBucket
		var err error
		switch metric {
		case "lateness_ms":
			var from int64
			if from, err = rs.offsetsFrom(ctx); err != nil {
				return nil, err
			}
			rows, err = rs.h.store.LatenessBuckets(ctx, rs.runID, from, p.From, p.To, p.Width)
		default:
			rows, err = rs.h.store.ScoreBuckets(ctx, rs.runID, p.From, p.To, p.Width)
			var after []store.RankBucket
			if err == nil && len(rows) > 0 {
				after, err = rs.afterStored(ctx, p)
			}
			if err == nil {
				rows, err = rs.beforeStored(ctx, p, rows)
				rows = append(rows, after...)
			}
		}
		if err != nil {
			return nil, err
		}
		byRank = map[int][]store.RankBucket{}
		for _, r := range rows {
			byRank[r.Rank] = append(byRank[r.Rank], r)
		}
		rs.cache[k] = byRank
	}
	bs := newBuckets(p)
	for _, r := range byRank[rank] {
		if a := bs.at(r.FirstStep); a != nil {
			a.add(r.FirstStep, r.FirstTime, r.Min, r.Max, r.Sum, r.Count)
		}
	}
	return bs, nil
}

// offsetsFrom is where GET /runs/{id}/ranks starts by default: the steady
// state of the run's lowest rank. Estimating the clock offsets over the
// same steps gives the lateness series the offsets that endpoint shows.
func (rs *rankSeries) offsetsFrom(ctx context.Context) (int64, error) {
	if rs.offsets != nil {
		return *rs.offsets, nil
	}
	ranks, err := rs.runRanks(ctx)
	if err != nil {
		return 0, err
	}
	var from int64
	if len(ranks) > 0 {
		if from, err = rs.h.steadyFrom(ctx, rs.runID, ranks[0]); err != nil {
			return 0, err
		}
	}
	rs.offsets = &from
	return from, nil
}

// runRanks reads the run's ranks once for every series of the answer.
func (rs *rankSeries) runRanks(ctx context.Context) ([]int, error) {
	if rs.ranks == nil {
		ranks, err := rs.h.store.RunRanks(ctx, rs.runID)
		if err != nil {
			return nil, err
		}
		rs.ranks = ranks
	}
	return rs.ranks, nil
}

// beforeStored puts before the stored scores of the plan the scores of
// its steps that have none, computed on read: the evaluator stores a
// series from its first pass over a run on, over the steps it read then,
// so a run it never watched has none stored and one it began watching
// late (a server started during the run, an evaluator that fell behind)
// has steps before them.
func (rs *rankSeries) beforeStored(ctx context.Context, p plan, stored []store.RankBucket) ([]store.RankBucket, error) {
	first := p.To + 1
	for _, r := range stored {
		first = min(first, r.FirstStep)
	}
	if first <= p.From {
		return stored, nil
	}
	q := p
	q.To = first - 1
	pre, err := rs.computedScores(ctx, q)
	if err != nil {
		return nil, err
	}
	return append(pre, stored...), nil
}

// afterStored is the scores of the plan's steps after the newest stored
// one, computed on read as the evaluator's next pass stores them: each
// rank's EWMA continued from its stored score, the cross-rank figures
// taken over the evaluator's window before them. The evaluator scores a
// live run every few seconds; without them the series would end a few
// seconds short of the run's steps until its next pass. Past the row
// budget (an evaluator far behind) the series ends at the stored scores.
func (rs *rankSeries) afterStored(ctx context.Context, p plan) ([]store.RankBucket, error) {
	heads, err := rs.h.store.LastRankScores(ctx, rs.runID)
	if err != nil || len(heads) == 0 || heads[0].Step >= p.To {
		return nil, err
	}
	last := heads[0].Step
	ranks, err := rs.runRanks(ctx)
	if err != nil || len(ranks) < 2 {
		return nil, err
	}
	cfg := rs.h.alertsConfig().WithMeta(rs.meta)
	lo := max(0, last+1-int64(cfg.Window))
	if int64(len(ranks))*(p.To-lo+1) > max(scoreRowBudget, rs.rowBudget) {
		return nil, nil
	}
	rows, err := rs.h.store.SyncSteps(ctx, rs.runID, ranks, lo, p.To)
	if err != nil {
		return nil, fmt.Errorf("query: score series: %w", err)
	}
	prev := make(map[int]float64, len(heads))
	for _, h := range heads {
		prev[h.Rank] = h.Score
	}
	var pts []detect.ScorePoint
	for _, pt := range detect.ScoreSeriesAfter(detect.ByRank(rows), cfg, last, prev) {
		if pt.Step >= p.From {
			pts = append(pts, pt)
		}
	}
	return bucketScores(pts, p.Width), nil
}

// scoreRowBudget is the most rank-steps a straggler score series is
// computed from row by row; past it, from the rollups of lateness and
// busy time (docs/scale.md), at the narrowest width that keeps the blocks
// read within it.
var scoreRowBudget int64 = 50_000

// computedScores are the straggler scores by step of a run the evaluator
// never scored (finished before the server watched it, or imported),
// computed on read by the evaluator's definition (detect.ScoreSeries), as
// GET /runs/{id}/ranks does for the final score; bucketed over the plan.
func (rs *rankSeries) computedScores(ctx context.Context, p plan) ([]store.RankBucket, error) {
	ranks, err := rs.runRanks(ctx)
	if err != nil || len(ranks) < 2 {
		return nil, err
	}
	cfg := rs.h.alertsConfig().WithMeta(rs.meta)
	n := int64(len(ranks))
	var pts []detect.ScorePoint
	if n*(p.To-p.From+1) <= max(scoreRowBudget, rs.rowBudget) {
		pts, err = rs.stepScores(ctx, p, ranks, cfg)
	} else {
		pts, err = rs.blockScores(ctx, p, n, cfg)
	}
	if err != nil {
		return nil, err
	}
	return bucketScores(pts, p.Width), nil
}

// stepScores computes the scores from every rank's steps of the plan's
// range, row by row: the caller bounds ranks × steps.
func (rs *rankSeries) stepScores(ctx context.Context, p plan, ranks []int, cfg detect.Config) ([]detect.ScorePoint, error) {
	if p.From > p.To {
		return nil, nil
	}
	rows, err := rs.h.store.SyncSteps(ctx, rs.runID, ranks, p.From, p.To)
	if err != nil {
		return nil, fmt.Errorf("query: score series: %w", err)
	}
	return detect.ScoreSeries(detect.ByRank(rows), cfg), nil
}

// blockScores computes the scores from the rollups of lateness and busy
// time: a few rows a rank a block.
func (rs *rankSeries) blockScores(ctx context.Context, p plan, ranks int64, cfg detect.Config) ([]detect.ScorePoint, error) {
	if err := rs.h.refreshRollups(ctx, rs.runID); err != nil {
		return nil, err
	}
	width := store.RollupWidths[len(store.RollupWidths)-1]
	for _, w := range store.RollupWidths {
		if ranks*((p.To-p.From)/w+1) <= scoreRowBudget {
			width = w
			break
		}
	}
	rows, err := rs.h.store.SyncBlocks(ctx, rs.runID, width, p.From, p.To, []string{"lateness_ms", "busy_ms"})
	if err != nil {
		return nil, err
	}
	var blocks []detect.ScoreBlock
	for _, r := range rows {
		if len(blocks) == 0 || blocks[len(blocks)-1].FirstStep/width != r.Bucket {
			blocks = append(blocks, detect.ScoreBlock{FirstStep: r.Bucket * width, FirstTime: r.FirstTime, Steps: width,
				Late: map[int]float64{}, Busy: map[int]float64{}})
		}
		b := &blocks[len(blocks)-1]
		if r.FirstTime.Before(b.FirstTime) {
			b.FirstTime = r.FirstTime
		}
		if r.Metric == "lateness_ms" {
			b.Late[r.Rank] = r.Mean
		} else {
			b.Busy[r.Rank] = r.Mean
		}
	}
	return detect.BlockScores(blocks, cfg), nil
}

// bucketScores sums scores (or any per-rank value by step) into buckets
// of width steps, by rank.
func bucketScores(pts []detect.ScorePoint, width int64) []store.RankBucket {
	type key struct {
		rank   int
		bucket int64
	}
	at := map[key]int{}
	var out []store.RankBucket
	for _, s := range pts {
		k := key{s.Rank, s.Step / width}
		i, ok := at[k]
		if !ok {
			at[k] = len(out)
			out = append(out, store.RankBucket{Rank: s.Rank, FirstStep: s.Step, FirstTime: s.Time, Min: s.Score, Max: s.Score})
			i = len(out) - 1
		}
		b := &out[i]
		if s.Step < b.FirstStep {
			b.FirstStep, b.FirstTime = s.Step, s.Time
		}
		b.Min, b.Max = min(b.Min, s.Score), max(b.Max, s.Score)
		b.Sum += s.Score
		b.Count++
	}
	return out
}

// stepLateness is every rank's lateness over the plan computed from its
// steps by the detectors' definition (detect.SyncSteps), the clock
// offsets estimated over the plan's steps: the step-by-step read of a
// distribution over many ranks, which the lateness SQL of a few ranks'
// series is too slow for. The caller bounds ranks × steps.
func (rs *rankSeries) stepLateness(ctx context.Context, p plan) ([]store.RankBucket, error) {
	ranks, err := rs.runRanks(ctx)
	if err != nil || len(ranks) < 2 || p.From > p.To {
		return nil, err
	}
	rows, err := rs.h.store.SyncSteps(ctx, rs.runID, ranks, p.From, p.To)
	if err != nil {
		return nil, fmt.Errorf("query: lateness by rank: %w", err)
	}
	byRank := detect.ByRank(rows)
	var pts []detect.ScorePoint
	for _, st := range detect.SyncSteps(byRank, len(rows)) {
		for r, late := range st.Late {
			if !math.IsNaN(late) {
				pts = append(pts, detect.ScorePoint{Rank: r, Step: st.Step, Time: st.Time, Score: late})
			}
		}
	}
	return bucketScores(pts, p.Width), nil
}
