package query

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// rankAll reads the rank parameter of GET /runs/{id}/series: all is set
// when one value is "all", and named holds the other values (ranks a user
// asked to see beside the distribution).
func rankAll(c echo.Context) (all bool, named []int, err error) {
	for _, v := range multiParam(c, "rank") {
		for _, s := range strings.Split(v, ",") {
			s = strings.TrimSpace(s)
			if s == "all" {
				all = true
				continue
			}
			n, perr := strconv.ParseInt(s, 10, 64)
			if perr != nil || n < 0 || n > api.MaxRank {
				return false, nil, bad("rank", "want all or a rank between 0 and %d, got %q", api.MaxRank, s)
			}
			named = append(named, int(n))
		}
	}
	return all, named, nil
}

// maxTopRanks bounds top=, the ranks drawn beside a distribution.
const maxTopRanks = api.MaxRankSeries

// spreadPlan is the plan of a distribution: whole rollup buckets of at
// least 100 steps, at most maxPoints of them.
func spreadPlan(from, to int64, maxPoints int) plan {
	p := planBuckets(from, to, maxPoints)
	if p.Rollup == 0 {
		p.Rollup, p.Width = store.RollupWidths[0], store.RollupWidths[0]
		for to/p.Width-from/p.Width+1 > int64(maxPoints) {
			p.Width += p.Rollup
		}
	}
	return p
}

// spreadSeries answers rank=all on a run of more than api.MaxRankSeries
// ranks: each metric's distribution over the ranks, and the series of the
// top ranks by the first metric's mean and of the ranks named.
func (h *Handler) spreadSeries(ctx context.Context, c echo.Context, r *store.RunRow, metrics []string, ranks, named []int,
	top, maxPoints int, window timeWindow) (any, error) {
	if len(named) > maxTopRanks {
		return nil, bad("rank", "at most %d ranks beside all", maxTopRanks)
	}
	out := api.SeriesResponse{RunID: r.RunID, MaxPoints: maxPoints, Series: []api.Series{}, Spread: []api.SeriesSpread{},
		Ranks: len(ranks)}
	if err := h.refreshRollups(ctx, r.RunID); err != nil {
		return nil, err
	}
	first, last, ok, err := h.store.StepSpan(ctx, r.RunID, ranks[0])
	if err != nil {
		return nil, err
	}
	if ok && window.set() {
		if first, last, ok, err = h.stepsInWindow(ctx, r.RunID, ranks[0], first, last, window); err != nil {
			return nil, err
		}
	}
	from, to, _ := stepRange(c, first, last)
	if !ok || from > to {
		out.Notice = fmt.Sprintf("%d ranks: no steps in the range asked", len(ranks))
		return out, nil
	}
	rs := newReadSpread(from, to, len(ranks), maxPoints)
	across := newRankSeries(h, r)
	across.rowBudget = spreadRowBudget
	across.ranks = ranks
	// Each metric's distribution, and the ranks' buckets of those computed
	// on read, which give their top ranks and series too.
	computed := map[string]map[int]*buckets{}
	for _, m := range metrics {
		p, onRead := rs.computed(m)
		if !onRead {
			sp, err := h.spread(ctx, r.RunID, m, p)
			if err != nil {
				return nil, err
			}
			out.Spread = append(out.Spread, sp)
			continue
		}
		byRank, err := h.rankBuckets(ctx, across, r.RunID, m, p)
		if err != nil {
			return nil, err
		}
		computed[m] = byRank
		out.Spread = append(out.Spread, spreadOf(m, p, byRank))
	}
	show := append([]int(nil), named...)
	if top > 0 {
		if byRank, ok := computed[metrics[0]]; ok {
			show = append(show, topOf(byRank, top)...)
		} else {
			t, err := h.store.TopRanks(ctx, r.RunID, metrics[0], top)
			if err != nil {
				return nil, err
			}
			show = append(show, t...)
		}
	}
	seen := map[int]bool{}
	for _, rank := range show {
		if seen[rank] {
			continue
		}
		seen[rank] = true
		for _, m := range metrics {
			p, _ := rs.computed(m)
			bs := computed[m][rank]
			if bs == nil {
				if _, onRead := computed[m]; onRead {
					bs = newBuckets(p)
				} else if bs, err = h.rollupBuckets(ctx, r.RunID, rank, m, p); err != nil {
					return nil, err
				}
			}
			out.Series = append(out.Series, seriesOf(m, rank, p, bs))
		}
	}
	p0, _ := rs.computed(metrics[0])
	out.Notice = fmt.Sprintf("%d ranks: their distribution %s, and the series of %d of them (the top %d by %s and any named)",
		len(ranks), bucketWords(p0.Width), len(seen), top, metrics[0])
	return out, nil
}

// bucketWords says how wide a distribution's buckets are.
func bucketWords(width int64) string {
	if width == 1 {
		return "step by step"
	}
	return fmt.Sprintf("in buckets of %d steps", width)
}

// spread reads one metric's distribution over the plan.
func (h *Handler) spread(ctx context.Context, runID, metric string, p plan) (api.SeriesSpread, error) {
	out := api.SeriesSpread{Metric: metric, Unit: metricUnits[metric], BucketSteps: p.Width, Points: []api.SpreadPoint{}}
	rows, err := h.store.MetricSpread(ctx, runID, metric, p.Rollup, p.From/p.Rollup, p.To/p.Rollup)
	if err != nil {
		return out, err
	}
	type comb struct {
		pt                 api.SpreadPoint
		sum                float64
		n                  int64
		p5, p50, p95, wsum float64
		started            bool
	}
	var cur comb
	curBucket := int64(-1)
	flush := func() {
		if !cur.started {
			return
		}
		pt := cur.pt
		pt.Mean = api.Float(cur.sum / float64(cur.n))
		if cur.wsum > 0 {
			pt.P5, pt.Median, pt.P95 = api.Float(cur.p5/cur.wsum), api.Float(cur.p50/cur.wsum), api.Float(cur.p95/cur.wsum)
		}
		out.Points = append(out.Points, pt)
	}
	for _, r := range rows {
		b := r.Bucket * p.Rollup / p.Width
		if b != curBucket {
			flush()
			cur, curBucket = comb{}, b
		}
		w := float64(r.Count)
		if !cur.started {
			cur.started = true
			cur.pt = api.SpreadPoint{Step: r.FirstStep, Time: r.FirstTime, Min: api.Float(r.MeanMin), Max: api.Float(r.MeanMax),
				Ranks: r.Ranks, MaxRank: r.MaxRank}
		} else {
			if pgLess(r.MeanMin, float64(cur.pt.Min)) {
				cur.pt.Min = api.Float(r.MeanMin)
			}
			if pgLess(float64(cur.pt.Max), r.MeanMax) {
				cur.pt.Max, cur.pt.MaxRank = api.Float(r.MeanMax), r.MaxRank
			}
			cur.pt.Ranks = max(cur.pt.Ranks, r.Ranks)
		}
		cur.sum += r.Sum
		cur.n += r.Count
		cur.p5 += w * r.P5
		cur.p50 += w * r.P50
		cur.p95 += w * r.P95
		cur.wsum += w
	}
	flush()
	return out, nil
}

// rollupBuckets reads one rank's metric over the plan from whole rollup
// buckets only, the plan's edges included (a distribution's companion
// series covers the same buckets as the distribution).
func (h *Handler) rollupBuckets(ctx context.Context, runID string, rank int, metric string, p plan) (*buckets, error) {
	bs := newBuckets(p)
	rows, err := h.store.MetricRollups(ctx, runID, rank, metric, p.Rollup, p.From/p.Rollup, p.To/p.Rollup)
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		a := bs.at(r.Bucket * p.Rollup)
		if a == nil {
			a = bs.at(max(r.Bucket*p.Rollup, p.From))
		}
		if a != nil {
			a.add(r.FirstStep, r.FirstTime, r.Min, r.Max, r.Sum, r.Count)
		}
	}
	return bs, nil
}

// seriesOf turns buckets into one rank's series of a metric.
func seriesOf(metric string, rank int, p plan, bs *buckets) api.Series {
	s := api.Series{Metric: metric, Rank: rank, Unit: metricUnits[metric], BucketSteps: p.Width, Points: []api.Point{}}
	for _, a := range bs.b {
		if a.count == 0 {
			continue
		}
		s.Points = append(s.Points, api.Point{Step: a.firstStep, Time: a.firstTime, Value: api.Float(a.sum / float64(a.count)),
			Min: api.Float(a.min), Max: api.Float(a.max), Count: a.count})
	}
	return s
}
