package query

import (
	"context"
	"fmt"
	"math"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/detect"
	"github.com/deepseed/deepseed/store"
)

// ownWork adds the own-work signal (detect.OwnWorkOf, docs/ranks.md) to
// the ranks of out: each rank's own excess, its cause and the wait hidden
// in its phases, and, where the first signal (lateness, or step time when
// no lateness was recorded) names nobody, the ranks whose own excess is
// above the threshold as stragglers. A run read row by row is judged on
// each rank's newest window steps from from on, as the alert is; one read
// from rollups on each rank's means over the steady state (agg, syncs).
func (h *Handler) ownWork(ctx context.Context, r *store.RunRow, ranks []int, from int64, agg []store.SteadyRank,
	syncs map[int]store.RankSync, pct float64, src string, out *api.RanksResponse) error {
	if len(ranks) < 2 {
		return nil
	}
	var o detect.OwnWork
	if out.Basis == "rollups" {
		o = ownFromMeans(agg, syncs)
	} else {
		cfg := h.alertsConfig().WithMeta(r.Meta)
		rows, err := h.store.RecentStepsFrom(ctx, r.RunID, ranks, cfg.Window, from)
		if err != nil {
			return fmt.Errorf("query: own work: %w", err)
		}
		o = detect.OwnWorkOf(detect.ByRank(rows), cfg.Window)
	}
	if o.Ranks == nil {
		return nil
	}
	th := o.OwnThreshold(pct)
	out.OwnThresholdMS = fv(th)
	named := map[int]bool{}
	for _, q := range o.Stragglers(pct) {
		named[q] = true
	}
	anyFirst := false
	for _, st := range out.Ranks {
		anyFirst = anyFirst || st.Straggler
	}
	for i := range out.Ranks {
		st := &out.Ranks[i]
		x, ok := o.Ranks[st.Rank]
		if ok {
			st.OwnExcessMS, st.HiddenWaitMS = fv(x.ExcessMS), fv(x.HiddenWaitMS)
			if named[st.Rank] {
				st.OwnCause = x.Cause
			}
		}
		switch {
		case st.Straggler && src != "":
			st.StragglerBy, st.DelayMS = "lateness", st.LatenessMS
		case st.Straggler:
			st.StragglerBy = "step_time"
		case !anyFirst && named[st.Rank]:
			st.Straggler, st.StragglerBy = true, "own_work"
		}
		if st.DelayMS == nil {
			switch {
			case src != "" && anyFirst:
				st.DelayMS = st.LatenessMS
			case ok:
				st.DelayMS = fv(x.ExcessMS)
			}
		}
	}
	return nil
}

// ownFromMeans is the own work of a run read from rollups: one row a
// rank of its means over the steady state, counted as the fewest steps
// a rank has there.
func ownFromMeans(agg []store.SteadyRank, syncs map[int]store.RankSync) detect.OwnWork {
	byRank := map[int][]detect.StepRow{}
	steps := int64(math.MaxInt64)
	for _, a := range agg {
		row := detect.StepRow{Rank: a.Rank, StepMS: a.StepMS, DataMS: a.DataMS, ForwardMS: a.ForwardMS,
			BackwardMS: a.BackwardMS, OptimizerMS: a.OptimizerMS, CommExposedMS: a.CommExposedMS}
		if sy, ok := syncs[a.Rank]; ok {
			row.SyncWaitMS, row.InputWaitMS = sy.MeanSyncWaitMS, sy.InputWaitMS
		}
		byRank[a.Rank] = []detect.StepRow{row}
		steps = min(steps, a.Rows)
	}
	o := detect.OwnWorkOf(byRank, 1)
	if o.Steps > 0 {
		o.Steps = int(steps)
	}
	return o
}
