package query

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"

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
	if _, err := h.store.RefreshRollups(ctx, r.RunID); err != nil {
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

// --- compare ---

// compareFigures names the figures of a compare row, as in delta_pct.
var compareFigures = []string{"gpu_mem_peak_mb", "gpu_mem_mean_mb", "gpu_util_pct", "cpu_util_pct", "step_time_s",
	"steps_per_s", "samples_per_s", "tflops", "mfu", "final_loss", "best_eval_accuracy", "wasted_gpu_h"}

func figureOf(row *api.CompareRow, name string) *api.Float {
	switch name {
	case "gpu_mem_peak_mb":
		return row.GPUMemPeakMB
	case "gpu_mem_mean_mb":
		return row.GPUMemMeanMB
	case "gpu_util_pct":
		return row.GPUUtilPct
	case "cpu_util_pct":
		return row.CPUUtilPct
	case "step_time_s":
		return row.StepTimeS
	case "steps_per_s":
		return row.StepsPerS
	case "samples_per_s":
		return row.SamplesPerS
	case "tflops":
		return row.TFLOPS
	case "mfu":
		return row.MFU
	case "final_loss":
		return row.FinalLoss
	case "best_eval_accuracy":
		return row.BestEvalAcc
	case "wasted_gpu_h":
		return row.WastedGPUH
	}
	return nil
}

func (h *Handler) compare(ctx context.Context, c echo.Context) (any, error) {
	ids := multiParam(c, "run")
	sweep, project := c.QueryParam("sweep"), c.QueryParam("project")
	if len(ids) == 0 && sweep == "" && project == "" {
		return nil, bad("run", "name runs with run=…, or a sweep= or project=")
	}
	if len(ids) > 100 {
		return nil, bad("run", "at most 100 runs")
	}
	f := store.RunFilter{Sweep: sweep, Project: project, RunIDs: ids, Limit: 200}
	runs, _, err := h.store.ListRuns(ctx, f)
	if err != nil {
		return nil, err
	}
	if len(ids) > 0 {
		found := map[string]bool{}
		for _, r := range runs {
			found[r.RunID] = true
		}
		for _, id := range ids {
			if !found[id] {
				return nil, &notFound{what: fmt.Sprintf("run %q", id)}
			}
		}
		order := map[string]int{}
		for i, id := range ids {
			order[id] = i
		}
		sort.SliceStable(runs, func(i, j int) bool { return order[runs[i].RunID] < order[runs[j].RunID] })
	} else {
		// Oldest first: the order in which a sweep was run.
		sort.SliceStable(runs, func(i, j int) bool {
			a, b := runs[i].StartedAt, runs[j].StartedAt
			if a == nil || b == nil || a.Equal(*b) {
				return runs[i].Name < runs[j].Name
			}
			return a.Before(*b)
		})
	}
	out := api.CompareResponse{Baseline: c.QueryParam("baseline"), Rows: []api.CompareRow{}}
	for _, r := range runs {
		row, err := h.compareRow(ctx, r)
		if err != nil {
			return nil, err
		}
		out.Rows = append(out.Rows, *row)
	}
	if out.Baseline == "" {
		return out, nil
	}
	var base *api.CompareRow
	for i := range out.Rows {
		if out.Rows[i].RunID == out.Baseline {
			base = &out.Rows[i]
		}
	}
	if base == nil {
		br, err := h.store.GetRun(ctx, out.Baseline)
		if errors.Is(err, store.ErrNotFound) {
			return nil, bad("baseline", "no run %q", out.Baseline)
		}
		if err != nil {
			return nil, err
		}
		if base, err = h.compareRow(ctx, br); err != nil {
			return nil, err
		}
	}
	for i := range out.Rows {
		row := &out.Rows[i]
		row.DeltaPct = map[string]*api.Float{}
		for _, name := range compareFigures {
			v, b := figureOf(row, name), figureOf(base, name)
			var d *api.Float
			if v != nil && b != nil && float64(*b) != 0 {
				d = fv((float64(*v) - float64(*b)) / math.Abs(float64(*b)) * 100)
			}
			row.DeltaPct[name] = d
		}
	}
	return out, nil
}

// compareRow computes a run's steady-state figures over every rank:
// memory, utilisation and step time are means of per-step values (GPU and
// host samples attributed to the run stand in where steps lack them);
// steps/s is the steps advanced per second of wall clock between the
// first and last steady step, averaged over ranks; samples/s sums the
// ranks' mean throughput.
func (h *Handler) compareRow(ctx context.Context, r *store.RunRow) (*api.CompareRow, error) {
	var m api.RunMeta
	_ = json.Unmarshal(r.Meta, &m)
	row := &api.CompareRow{RunID: r.RunID, Name: r.Name, Project: r.Project, Status: r.Status, Model: m.Model,
		ZeroStage: m.ZeroStage, Precision: m.Precision, PipelineStages: m.PipelineStages, Parallelism: m.Parallelism,
		OffloadOptim: m.OffloadOptim, OffloadParams: m.OffloadParams, MicroBatch: m.MicroBatch, WorldSize: m.WorldSize}
	if row.Precision == "" {
		row.Precision = precisionFromConfig(r.Config)
	}
	w, err := h.wasted(ctx, r)
	if err != nil {
		return nil, err
	}
	total := w.Total
	row.Wasted, row.WastedGPUH = &w, &total
	if row.Parallelism == "" {
		row.Parallelism = "data"
		if m.PipelineStages != nil && *m.PipelineStages > 1 {
			row.Parallelism = "pipeline"
		}
	}
	ranks, err := h.store.RunRanks(ctx, r.RunID)
	if err != nil {
		return nil, err
	}
	if len(ranks) > 0 {
		from, err := h.steadyFrom(ctx, r.RunID, ranks[0])
		if err != nil {
			return nil, err
		}
		agg, err := h.store.SteadyByRank(ctx, r.RunID, from, -1)
		if err != nil {
			return nil, err
		}
		h.fillSteady(ctx, r.RunID, row, agg, m)
		if err := h.fillFromSamples(ctx, r.RunID, row, agg); err != nil {
			return nil, err
		}
	}
	st, err := h.store.RunStats(ctx, r.RunID)
	if err != nil {
		return nil, err
	}
	row.FinalLoss = fp(st.FinalLoss)
	ev, err := h.store.EvalStats(ctx, r.RunID)
	if err != nil {
		return nil, err
	}
	row.BestEvalAcc = fp(ev.BestAcc)
	return row, nil
}

// meanOf averages a figure over the ranks that have it.
func meanOf(agg []store.SteadyRank, get func(store.SteadyRank) *float64) *float64 {
	sum, n := 0.0, 0
	for _, a := range agg {
		if v := get(a); v != nil {
			sum += *v
			n++
		}
	}
	if n == 0 {
		return nil
	}
	v := sum / float64(n)
	return &v
}

func (h *Handler) fillSteady(ctx context.Context, runID string, row *api.CompareRow, agg []store.SteadyRank, m api.RunMeta) {
	row.GPUMemMeanMB = fp(scale(meanOf(agg, func(a store.SteadyRank) *float64 { return a.GPUMemGB }), 1000))
	var peak *float64
	for _, a := range agg {
		if a.PeakGPUMemGB != nil && (peak == nil || *a.PeakGPUMemGB > *peak) {
			peak = a.PeakGPUMemGB
		}
	}
	row.GPUMemPeakMB = fp(scale(peak, 1000))
	row.GPUUtilPct = fp(meanOf(agg, func(a store.SteadyRank) *float64 { return a.GPUUtil }))
	row.CPUUtilPct = fp(meanOf(agg, func(a store.SteadyRank) *float64 { return a.CPUUtil }))
	stepMS := meanOf(agg, func(a store.SteadyRank) *float64 { return a.StepMS })
	row.StepTimeS = fp(scale(stepMS, 1e-3))
	row.StepsPerS = fp(meanOf(agg, func(a store.SteadyRank) *float64 {
		d := a.LastTime.Sub(a.FirstTime).Seconds()
		if a.LastStep <= a.FirstStep || d <= 0 {
			return nil
		}
		v := float64(a.LastStep-a.FirstStep) / d
		return &v
	}))
	if row.StepsPerS == nil && stepMS != nil && *stepMS > 0 {
		row.StepsPerS = fv(1000 / *stepMS)
	}
	var sps *float64
	for _, a := range agg {
		if a.ThroughputSPS != nil {
			if sps == nil {
				sps = new(float64)
			}
			*sps += *a.ThroughputSPS
		}
	}
	if sps == nil && row.StepsPerS != nil && m.MicroBatch != nil {
		v := float64(*row.StepsPerS) * float64(*m.MicroBatch)
		if m.GradAccum != nil {
			v *= float64(*m.GradAccum)
		}
		if m.WorldSize != nil {
			v *= float64(*m.WorldSize)
		}
		sps = &v
	}
	row.SamplesPerS = fp(sps)
	// Per GPU: the mean over ranks, each rank's own GPU.
	row.TFLOPS = fp(meanOf(agg, func(a store.SteadyRank) *float64 { return a.TFLOPS }))
	row.MFU = fp(meanOf(agg, func(a store.SteadyRank) *float64 { return a.MFU }))
}

// fillFromSamples fills memory, GPU and CPU figures the steps lacked from
// GPU and host samples attributed to the run during its steady state.
func (h *Handler) fillFromSamples(ctx context.Context, runID string, row *api.CompareRow, agg []store.SteadyRank) error {
	if row.GPUMemMeanMB != nil && row.GPUUtilPct != nil && row.CPUUtilPct != nil {
		return nil
	}
	var from, to = zeroTime, zeroTime
	for _, a := range agg {
		if from.IsZero() || a.FirstTime.Before(from) {
			from = a.FirstTime
		}
		if a.LastTime.After(to) {
			to = a.LastTime
		}
	}
	if row.GPUMemMeanMB == nil || row.GPUUtilPct == nil {
		g, err := h.store.GPUSampleStats(ctx, runID, from, to)
		if err != nil {
			return err
		}
		if row.GPUMemMeanMB == nil {
			row.GPUMemMeanMB = fp(scale(g.MeanMemBytes, 1e-6))
			row.GPUMemPeakMB = fp(scale(g.PeakMemBytes, 1e-6))
		}
		if row.GPUUtilPct == nil {
			row.GPUUtilPct = fp(g.MeanUtil)
		}
	}
	if row.CPUUtilPct == nil {
		v, err := h.store.HostProcessCPU(ctx, runID, from, to)
		if err != nil {
			return err
		}
		row.CPUUtilPct = fp(v)
	}
	return nil
}
