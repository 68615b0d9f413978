package query

import (
	"context"

	"github.com/deepseed/deepseed/store"
)

// rankSeries serves the series of store.RankMetrics within one request:
// lateness (computed from every rank's arrivals with the clock offsets of
// GET /runs/{id}/ranks) and the stored straggler score. Both come for
// every rank at once, so each plan is read once and shared by the ranks.
type rankSeries struct {
	h       *Handler
	runID   string
	offsets *int64 // first step of the clock offset estimate, once known
	cache   map[rankSeriesKey]map[int][]store.RankBucket
}

type rankSeriesKey struct {
	metric          string
	from, to, width int64
}

func newRankSeries(h *Handler, runID string) *rankSeries {
	return &rankSeries{h: h, runID: runID, cache: map[rankSeriesKey]map[int][]store.RankBucket{}}
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
	ranks, err := rs.h.store.RunRanks(ctx, rs.runID)
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
