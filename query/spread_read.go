package query

import (
	"context"
	"math"
	"slices"
	"sort"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// spreadRowBudget is the most rank-steps a distribution over the ranks is
// computed from row by row, in buckets as narrow as the panel allows: a
// run too short for the rollups' buckets of 100 steps (a few hundred
// steps of a thousand ranks) is drawn at the resolution it has, not as
// two or three points. A longer run reads the stored spread.
var spreadRowBudget int64 = 500_000

// readSpread tells how spreadSeries reads one metric's distribution: from
// the stored spread (metric_spread) over rollup buckets, or computed on
// read from every rank's buckets of the plan.
type readSpread struct {
	stored, raw plan
	// scores is the plan of the straggler score: the stored plan, its
	// buckets widened until the ranks' buckets fit spreadRowBudget.
	scores plan
	// rawFits is set when the run's ranks × steps fit spreadRowBudget and
	// the raw plan is finer than the stored one.
	rawFits bool
}

func newReadSpread(from, to int64, ranks, maxPoints int) readSpread {
	rs := readSpread{stored: spreadPlan(from, to, maxPoints), raw: planBuckets(from, to, maxPoints)}
	rs.rawFits = rs.raw.Rollup == 0 && rs.raw.Width < rs.stored.Width && int64(ranks)*(to-from+1) <= spreadRowBudget
	rs.scores = rs.stored
	for int64(ranks)*(to/rs.scores.Width-from/rs.scores.Width+1) > spreadRowBudget {
		rs.scores.Width += rs.scores.Rollup
	}
	return rs
}

// computed reports whether metric's distribution is computed on read,
// and over which plan: the straggler score always (it has no rollups),
// every metric when the raw plan fits.
func (rs readSpread) computed(metric string) (plan, bool) {
	if rs.rawFits {
		return rs.raw, true
	}
	if metric == "straggler_score" {
		return rs.scores, true
	}
	return rs.stored, false
}

// rankBuckets reads every rank's buckets of metric over the plan in one
// statement: lateness from the ranks' steps, the straggler score through
// rankSeries, step metrics from their raw rows.
func (h *Handler) rankBuckets(ctx context.Context, across *rankSeries, runID, metric string, p plan) (map[int]*buckets, error) {
	out := map[int]*buckets{}
	if metric == "straggler_score" {
		ranks, err := across.runRanks(ctx)
		if err != nil {
			return nil, err
		}
		for _, rank := range ranks {
			bs, err := across.buckets(ctx, rank, metric, p)
			if err != nil {
				return nil, err
			}
			out[rank] = bs
		}
		return out, nil
	}
	var rows []store.RankBucket
	var err error
	if metric == "lateness_ms" {
		rows, err = across.stepLateness(ctx, p)
	} else {
		rows, err = h.store.StepBuckets(ctx, runID, metric, p.From, p.To, p.Width)
	}
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		bs := out[r.Rank]
		if bs == nil {
			bs = newBuckets(p)
			out[r.Rank] = bs
		}
		if a := bs.at(r.FirstStep); a != nil {
			a.add(r.FirstStep, r.FirstTime, r.Min, r.Max, r.Sum, r.Count)
		}
	}
	return out, nil
}

// spreadOf is the distribution of the ranks' means bucket by bucket, as
// the stored spread defines it (store.spreadSQL): the lowest, the 5th
// percentile, median and 95th percentile interpolated as percentile_cont
// does, the highest and its rank, over the ranks with a value in the
// bucket; NaN sorts above every number, as in PostgreSQL.
func spreadOf(metric string, p plan, byRank map[int]*buckets) api.SeriesSpread {
	out := api.SeriesSpread{Metric: metric, Unit: metricUnits[metric], BucketSteps: p.Width, Points: []api.SpreadPoint{}}
	ranks := make([]int, 0, len(byRank))
	for r := range byRank {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	n := int(p.slots())
	type mean struct {
		rank int
		v    float64
	}
	for i := 0; i < n; i++ {
		var means []mean
		var pt api.SpreadPoint
		var sum float64
		var count int64
		for _, r := range ranks {
			a := byRank[r].b[i]
			if a.count == 0 {
				continue
			}
			if len(means) == 0 || a.firstStep < pt.Step {
				pt.Step, pt.Time = a.firstStep, a.firstTime
			}
			means = append(means, mean{r, a.sum / float64(a.count)})
			sum += a.sum
			count += a.count
		}
		if len(means) == 0 {
			continue
		}
		// Highest first, the lowest rank first among equals, as the
		// stored spread names its max_rank.
		sort.SliceStable(means, func(x, y int) bool { return pgLess(means[y].v, means[x].v) })
		vs := make([]float64, len(means))
		for j, m := range means {
			vs[len(means)-1-j] = m.v
		}
		pt.Max, pt.MaxRank, pt.Min = api.Float(vs[len(vs)-1]), means[0].rank, api.Float(vs[0])
		pt.P5, pt.Median, pt.P95 = api.Float(percentileCont(vs, 0.05)), api.Float(percentileCont(vs, 0.5)), api.Float(percentileCont(vs, 0.95))
		pt.Mean, pt.Ranks = api.Float(sum/float64(count)), len(means)
		out.Points = append(out.Points, pt)
	}
	return out
}

// percentileCont is PostgreSQL's percentile_cont of ascending values.
func percentileCont(sorted []float64, q float64) float64 {
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

// topOf is the k ranks of the highest mean of their buckets over the
// plan, highest first (a NaN mean counts as highest, as store.TopRanks
// orders them), the lowest rank first among equals.
func topOf(byRank map[int]*buckets, k int) []int {
	type mean struct {
		rank int
		v    float64
	}
	var means []mean
	for r, bs := range byRank {
		var sum float64
		var n int64
		for _, a := range bs.b {
			sum += a.sum
			n += a.count
		}
		if n > 0 {
			means = append(means, mean{r, sum / float64(n)})
		}
	}
	sort.Slice(means, func(x, y int) bool {
		if means[x].v == means[y].v || (math.IsNaN(means[x].v) && math.IsNaN(means[y].v)) {
			return means[x].rank < means[y].rank
		}
		return pgLess(means[y].v, means[x].v)
	})
	out := make([]int, 0, k)
	for _, m := range means[:min(k, len(means))] {
		out = append(out, m.rank)
	}
	return out
}
