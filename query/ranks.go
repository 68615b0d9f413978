package query

import (
	"context"
	"fmt"
	"math"
	"sort"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/detect"
	"github.com/deepseed/deepseed/internal/stats"
	"github.com/deepseed/deepseed/store"
)

// ranks answers GET /runs/{id}/ranks: every rank's steady-state figures,
// the stragglers flagged, and the ranks rolled up by host. A run of up to
// store.ExactRankRows rank-steps is read row by row; a larger one from
// its rollups (docs/scale.md), so the work is a few rows a rank whatever
// the number of steps.
func (h *Handler) ranks(ctx context.Context, c echo.Context) (any, error) {
	r, err := h.run(ctx, c)
	if err != nil {
		return nil, err
	}
	pct := h.opt.StragglerPct
	if s := c.QueryParam("straggler_pct"); s != "" {
		var v float64
		if _, err := fmt.Sscan(s, &v); err != nil || !finite(v) || v < 0 || v > 1000 {
			return nil, bad("straggler_pct", "want a number between 0 and 1000, got %q", s)
		}
		pct = v
	}
	ranks, err := h.store.RunRanks(ctx, r.RunID)
	if err != nil {
		return nil, err
	}
	out := api.RanksResponse{RunID: r.RunID, StragglerPct: api.Float(pct), Ranks: []api.RankStat{}, Hosts: []api.HostStat{}, Basis: "steps"}
	if len(ranks) == 0 {
		return out, nil
	}
	from, err := h.steadyParam(ctx, c, r.RunID, ranks[0])
	if err != nil {
		return nil, err
	}
	return h.rankReport(ctx, r, ranks, pct, from)
}

// rankReport is the /ranks answer of a run with ranks, from step from
// on, stragglers past pct.
func (h *Handler) rankReport(ctx context.Context, r *store.RunRow, ranks []int, pct float64, from int64) (api.RanksResponse, error) {
	out := api.RanksResponse{RunID: r.RunID, StragglerPct: api.Float(pct), Ranks: []api.RankStat{}, Hosts: []api.HostStat{}, Basis: "steps"}
	out.FromStep = from
	agg, syncs, src, err := h.rankFigures(ctx, r.RunID, from, &out)
	if err != nil {
		return out, err
	}
	hosts, err := h.store.RankHosts(ctx, r.RunID)
	if err != nil {
		return out, err
	}
	out.LatenessFrom = src
	byRank := map[int]store.RankSync{}
	var busy []float64
	for _, s := range syncs {
		byRank[s.Rank] = s
		if s.BusyMS != nil {
			busy = append(busy, *s.BusyMS)
		}
	}
	medBusy := stats.Median(busy)
	var medians []float64
	for _, a := range agg {
		if a.MedianStepMS != nil {
			medians = append(medians, *a.MedianStepMS)
		}
	}
	med := stats.Median(medians)
	if len(medians) > 0 {
		out.MedianStepMS = api.Float(med)
	}
	for _, a := range agg {
		st := api.RankStat{Rank: a.Rank, Host: hosts[a.Rank], Steps: a.Rows, MeanGPUUtil: fp(a.GPUUtil),
			PeakMemGB: fp(a.PeakGPUMemGB), MedianStepMS: api.Float(math.NaN()), P95StepMS: api.Float(math.NaN())}
		if a.MedianStepMS != nil {
			st.MedianStepMS = api.Float(*a.MedianStepMS)
			st.Straggler = len(medians) > 1 && *a.MedianStepMS > med*(1+pct/100)
		}
		if a.P95StepMS != nil {
			st.P95StepMS = api.Float(*a.P95StepMS)
		}
		if a.WaitMS != nil {
			st.WaitMS = api.Float(*a.WaitMS)
		}
		if sy, ok := byRank[a.Rank]; ok {
			st.LatenessMS, st.BusyMS, st.SyncWaitMS = fp(sy.LatenessMS), fp(sy.BusyMS), fp(sy.SyncWaitMS)
			st.InputWaitMS, st.LastPct, st.ClockOffsetMS, st.StragglerScore = fp(sy.InputWaitMS), fp(sy.LastPct), fp(sy.ClockOffsetMS), fp(sy.Score)
			if sy.MeanSyncWaitMS != nil {
				st.WaitMS = api.Float(*sy.MeanSyncWaitMS)
			}
			// Lateness decides when recorded: step times are equal under
			// synchronous training, whoever is slow.
			if src != "" {
				st.Straggler = sy.LatenessMS != nil && medBusy > 0 && *sy.LatenessMS > medBusy*pct/100
			}
		}
		out.Ranks = append(out.Ranks, st)
	}
	if err := h.finalScores(ctx, r, ranks, &out); err != nil {
		return out, err
	}
	if err := h.ownWork(ctx, r, ranks, from, agg, byRank, pct, src, &out); err != nil {
		return out, err
	}
	out.Hosts = hostStats(out.Ranks)
	return out, nil
}

// finalScores gives the ranks of a run that has no stored straggler score
// (finished before the evaluator saw it, or imported) the score the
// evaluator would have given them at its last step, from its records
// (detect.FinalScores). It reads each rank's newest steps of the run's
// window, a bounded number of rows a rank, and writes nothing, so a query
// server on a standby can call it.
func (h *Handler) finalScores(ctx context.Context, r *store.RunRow, ranks []int, out *api.RanksResponse) error {
	for _, st := range out.Ranks {
		if st.StragglerScore != nil {
			return nil
		}
	}
	if len(ranks) < 2 {
		return nil
	}
	cfg := h.alertsConfig().WithMeta(r.Meta)
	rows, err := h.store.RecentSteps(ctx, r.RunID, ranks, cfg.Window)
	if err != nil {
		return fmt.Errorf("query: final scores: %w", err)
	}
	scores := detect.FinalScores(detect.ByRank(rows), cfg)
	if scores == nil {
		return nil
	}
	for i := range out.Ranks {
		if v, ok := scores[out.Ranks[i].Rank]; ok {
			out.Ranks[i].StragglerScore = fv(v)
		}
	}
	return nil
}

// rankFigures reads every rank's steady-state aggregates and
// synchronisation figures from step from on: row by row for a small run,
// from the rollups for a large one (out.Basis and out.FromStep say which).
func (h *Handler) rankFigures(ctx context.Context, runID string, from int64, out *api.RanksResponse) ([]store.SteadyRank, []store.RankSync, string, error) {
	large, err := h.pastRawBudget(ctx, runID, from, -1)
	if err != nil {
		return nil, nil, "", err
	}
	if !large {
		agg, err := h.store.SteadyByRank(ctx, runID, from, -1)
		if err != nil {
			return nil, nil, "", err
		}
		syncs, src, err := h.store.RankSyncs(ctx, runID, from)
		return agg, syncs, src, err
	}
	rr, err := h.store.RankRollups(ctx, runID, from, -1, true)
	if err != nil {
		return nil, nil, "", err
	}
	src, err := h.store.LatenessSource(ctx, runID)
	if err != nil {
		return nil, nil, "", err
	}
	out.Basis, out.FromStep = "rollups", from/100*100
	syncs := make([]store.RankSync, 0, len(rr))
	for _, x := range rr {
		if x.Sync.Steps > 0 || x.Sync.Score != nil {
			syncs = append(syncs, x.Sync)
		}
	}
	return steadyOf(rr), syncs, src, nil
}

// pastRawBudget refreshes the run's rollups and reports whether its steps
// from from on (of rank, or of every rank when rank < 0) are more than the
// per-rank views read row by row.
func (h *Handler) pastRawBudget(ctx context.Context, runID string, from int64, rank int) (bool, error) {
	if err := h.refreshRollups(ctx, runID); err != nil {
		return false, err
	}
	n, err := h.store.StepRows(ctx, runID, from, rank)
	return n > store.ExactRankRows, err
}

// steadyOf returns the steady-state aggregates of rank rollups.
func steadyOf(rr []store.RankRollup) []store.SteadyRank {
	agg := make([]store.SteadyRank, len(rr))
	for i, x := range rr {
		agg[i] = x.SteadyRank
	}
	return agg
}

// hostStats rolls ranks up by host, the host with the latest rank (or the
// slowest step) first.
func hostStats(ranks []api.RankStat) []api.HostStat {
	type acc struct {
		api.HostStat
		worst            float64
		lateSum, utilSum float64
		lateN, utilN     int
	}
	by := map[string]*acc{}
	var order []string
	for _, r := range ranks {
		a := by[r.Host]
		if a == nil {
			a = &acc{HostStat: api.HostStat{Host: r.Host, WorstRank: r.Rank}, worst: math.Inf(-1)}
			by[r.Host] = a
			order = append(order, r.Host)
		}
		a.Ranks++
		if r.Straggler {
			a.Stragglers++
		}
		key := float64(r.MedianStepMS)
		if r.LatenessMS != nil {
			key = float64(*r.LatenessMS)
			a.lateSum += key
			a.lateN++
			if a.MaxLatenessMS == nil || *r.LatenessMS > *a.MaxLatenessMS {
				a.MaxLatenessMS = r.LatenessMS
			}
		}
		if finite(key) && key > a.worst {
			a.worst, a.WorstRank = key, r.Rank
		}
		if v := r.MedianStepMS; finite(float64(v)) && (a.MaxStepMS == nil || v > *a.MaxStepMS) {
			a.MaxStepMS = &v
		}
		if r.MeanGPUUtil != nil && finite(float64(*r.MeanGPUUtil)) {
			a.utilSum += float64(*r.MeanGPUUtil)
			a.utilN++
		}
		if r.StragglerScore != nil && (a.MaxScore == nil || *r.StragglerScore > *a.MaxScore) {
			a.MaxScore = r.StragglerScore
		}
	}
	out := make([]api.HostStat, 0, len(order))
	for _, hname := range order {
		a := by[hname]
		if a.lateN > 0 {
			a.MeanLatenessMS = fv(a.lateSum / float64(a.lateN))
		}
		if a.utilN > 0 {
			a.MeanGPUUtil = fv(a.utilSum / float64(a.utilN))
		}
		out = append(out, a.HostStat)
	}
	sort.SliceStable(out, func(i, j int) bool {
		wi, wj := by[out[i].Host].worst, by[out[j].Host].worst
		if wi != wj {
			return wi > wj
		}
		return out[i].Host < out[j].Host
	})
	return out
}

// steadyRanks returns the steady-state aggregates of every rank (rank <
// 0) or of one, from step from on: row by row for a small run, from the
// rollups for a large one (then from the block holding from, and medians
// are means; see store.RankRollup).
func (h *Handler) steadyRanks(ctx context.Context, runID string, from int64, rank int) ([]store.SteadyRank, error) {
	large, err := h.pastRawBudget(ctx, runID, from, rank)
	if err != nil {
		return nil, err
	}
	if !large {
		return h.store.SteadyByRank(ctx, runID, from, rank)
	}
	rr, err := h.store.RankRollups(ctx, runID, from, rank, false)
	if err != nil {
		return nil, err
	}
	return steadyOf(rr), nil
}

// alertsConfig is the detectors' configuration the server runs with
// (Options.Alerts), whose straggler score runs never scored are given.
func (h *Handler) alertsConfig() detect.Config {
	if h.opt.Alerts != nil {
		return *h.opt.Alerts
	}
	return detect.Defaults()
}
