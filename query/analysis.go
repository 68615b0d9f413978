package query

import (
	"context"
	"encoding/json"
	"fmt"
	"math"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// steadyParam returns from_step when given, else the detected start of
// the steady state of rank.
func (h *Handler) steadyParam(ctx context.Context, c echo.Context, runID string, rank int) (int64, error) {
	from, err := optIntParam(c, "from_step", 0, api.MaxStep)
	if err != nil {
		return 0, err
	}
	if from != nil {
		return *from, nil
	}
	return h.steadyFrom(ctx, runID, rank)
}

func (h *Handler) breakdown(ctx context.Context, c echo.Context) (any, error) {
	r, err := h.run(ctx, c)
	if err != nil {
		return nil, err
	}
	rank, err := h.rankParam(ctx, c, r.RunID)
	if err != nil {
		return nil, err
	}
	from, err := h.steadyParam(ctx, c, r.RunID, rank)
	if err != nil {
		return nil, err
	}
	out := api.Breakdown{RunID: r.RunID, Rank: rank, FromStep: from, ToStep: from, Parts: []api.BreakdownPart{}}
	agg, err := h.store.SteadyByRank(ctx, r.RunID, from, rank)
	if err != nil {
		return nil, err
	}
	if len(agg) == 0 {
		return out, nil
	}
	a := agg[0]
	out.FromStep, out.ToStep, out.Steps = a.FirstStep, a.LastStep, a.Rows
	out.Parts = breakdownParts(a)
	total := 0.0
	for _, p := range out.Parts {
		total += float64(p.MS)
	}
	out.StepMS = api.Float(total)
	if a.StepMS != nil {
		out.StepMS = api.Float(*a.StepMS)
	}
	return out, nil
}

// breakdownParts splits the mean step time into the named parts and
// "other" (step minus the named parts, never negative); shares are of the
// larger of the step time and the parts' total, so they sum to 100.
func breakdownParts(a store.SteadyRank) []api.BreakdownPart {
	val := func(p *float64) float64 {
		if p == nil || !finite(*p) || *p < 0 {
			return 0
		}
		return *p
	}
	names := []string{"forward", "backward", "optimizer", "communication", "data"}
	ms := []float64{val(a.ForwardMS), val(a.BackwardMS), val(a.OptimizerMS), val(a.CommMS), val(a.DataMS)}
	named := 0.0
	for _, v := range ms {
		named += v
	}
	other := 0.0
	if a.StepMS != nil && finite(*a.StepMS) && *a.StepMS > named {
		other = *a.StepMS - named
	}
	names = append(names, "other")
	ms = append(ms, other)
	total := named + other
	parts := make([]api.BreakdownPart, len(names))
	for i, n := range names {
		share := 0.0
		if total > 0 {
			share = ms[i] / total * 100
		}
		parts[i] = api.BreakdownPart{Name: n, MS: api.Float(ms[i]), SharePct: api.Float(share)}
	}
	return parts
}

func (h *Handler) memory(ctx context.Context, c echo.Context) (any, error) {
	r, err := h.run(ctx, c)
	if err != nil {
		return nil, err
	}
	var meta api.RunMeta
	_ = json.Unmarshal(r.Meta, &meta)
	out := api.MemoryResponse{RunID: r.RunID, Parts: []api.MemoryPart{}}
	m, err := h.store.Memory(ctx, r.RunID)
	if err != nil {
		return nil, err
	}
	if m == nil {
		m = estimateMemory(meta, r.Config)
	}
	if m != nil {
		add := func(name string, b *float64, dev string) {
			if b == nil {
				return
			}
			if dev == "" {
				dev = "gpu"
			}
			v := wholeBytes(*b)
			out.Parts = append(out.Parts, api.MemoryPart{Name: name, Bytes: api.Float(v), Device: dev})
			if dev == "gpu" && finite(v) {
				out.PredictedGPUBytes += api.Float(v)
			}
		}
		add("parameters", m.Params, m.ParamsDevice)
		add("gradients", m.Grads, "gpu")
		add("optimizer", m.Optim, m.OptimDevice)
		add("activations", m.Activations, "gpu")
	}
	if err := h.refreshRollups(ctx, r.RunID); err != nil {
		return nil, err
	}
	st, err := h.store.RunStats(ctx, r.RunID)
	if err != nil {
		return nil, err
	}
	g, err := h.store.GPUSampleStats(ctx, r.RunID, zeroTime, zeroTime)
	if err != nil {
		return nil, err
	}
	peak := scale(st.PeakGPUMemGB, 1e9)
	if g.PeakMemBytes != nil && (peak == nil || *g.PeakMemBytes > *peak) {
		peak = g.PeakMemBytes
	}
	if peak != nil {
		out.PeakGPUBytes = fv(wholeBytes(*peak))
	}
	if meta.GPUMemTotalGB != nil {
		out.GPUTotalBytes = fv(wholeBytes(float64(*meta.GPUMemTotalGB) * 1e9))
	} else if g.TotalMemBytes != nil {
		out.GPUTotalBytes = fv(wholeBytes(*g.TotalMemBytes))
	}
	return out, nil
}

// wholeBytes rounds a byte count computed from gigabytes or shares of a
// model to whole bytes; NaN and infinities pass through.
func wholeBytes(b float64) float64 {
	if !finite(b) {
		return b
	}
	return math.Round(b)
}

// estimateMemory predicts the per-GPU ZeRO model-state memory from the
// run's meta ([api.ModelStateBytes]) when the run sent no breakdown.
func estimateMemory(m api.RunMeta, cfg json.RawMessage) *store.MemoryRow {
	if m.Params == nil || *m.Params <= 0 {
		return nil
	}
	prec := m.Precision
	if prec == "" {
		prec = precisionFromConfig(cfg)
	}
	world, stage := 1, 0
	if m.WorldSize != nil {
		world = *m.WorldSize
	}
	if m.ZeroStage != nil {
		stage = *m.ZeroStage
	}
	params, grads, optim := api.ModelStateBytes(float64(*m.Params), prec, world, stage)
	row := &store.MemoryRow{Params: &params, Grads: &grads, Optim: &optim, OptimDevice: "gpu", ParamsDevice: "gpu"}
	if m.OffloadOptim == "cpu" || m.OffloadOptim == "nvme" {
		row.OptimDevice = m.OffloadOptim
	}
	if m.OffloadParams == "cpu" || m.OffloadParams == "nvme" {
		row.ParamsDevice = m.OffloadParams
	}
	return row
}

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
	out := api.RanksResponse{RunID: r.RunID, StragglerPct: api.Float(pct), Ranks: []api.RankStat{}}
	if len(ranks) == 0 {
		return out, nil
	}
	from, err := h.steadyParam(ctx, c, r.RunID, ranks[0])
	if err != nil {
		return nil, err
	}
	agg, err := h.store.SteadyByRank(ctx, r.RunID, from, -1)
	if err != nil {
		return nil, err
	}
	hosts, err := h.store.RankHosts(ctx, r.RunID)
	if err != nil {
		return nil, err
	}
	syncs, src, err := h.store.RankSyncs(ctx, r.RunID, from)
	if err != nil {
		return nil, err
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
	medBusy := Median(busy)
	var medians []float64
	for _, a := range agg {
		if a.MedianStepMS != nil {
			medians = append(medians, *a.MedianStepMS)
		}
	}
	med := Median(medians)
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
	return out, nil
}
