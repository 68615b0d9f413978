package query

import (
	"context"
	"encoding/json"
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
	agg, err := h.steadyRanks(ctx, r.RunID, from, rank)
	if err != nil {
		return nil, err
	}
	if len(agg) == 0 {
		return out, nil
	}
	a := agg[0]
	out.FromStep, out.ToStep, out.Steps = a.FirstStep, a.LastStep, a.Rows
	out.Parts = breakdownParts(a)
	out.CommMS = fp(a.CommMS)
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
// Communication is the exposed communication (comm_exposed_ms) where the
// sender measured it: total collective time overlaps compute and would be
// counted twice. A sender that gives comm_ms alone (DeepSpeed's timers, an
// import) has it as communication.
func breakdownParts(a store.SteadyRank) []api.BreakdownPart {
	val := func(p *float64) float64 {
		if p == nil || !finite(*p) || *p < 0 {
			return 0
		}
		return *p
	}
	names := []string{"forward", "backward", "optimizer", "communication", "data"}
	comm := a.CommMS
	if a.CommExposedMS != nil {
		comm = a.CommExposedMS
	}
	ms := []float64{val(a.ForwardMS), val(a.BackwardMS), val(a.OptimizerMS), val(comm), val(a.DataMS)}
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
	if a := scale(st.AllocPeakGB, 1e9); a != nil {
		out.AllocPeakGPUBytes = fv(wholeBytes(*a))
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
