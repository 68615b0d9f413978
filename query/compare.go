package query

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// compareFigures names the figures of a compare row, as in delta_pct.
var compareFigures = []string{"gpu_mem_peak_mb", "gpu_mem_mean_mb", "gpu_mem_alloc_peak_mb", "gpu_util_pct", "cpu_util_pct", "step_time_s",
	"steps_per_s", "samples_per_s", "comm_ms", "comm_exposed_ms", "tflops", "mfu", "final_loss", "best_eval_accuracy", "wasted_gpu_h"}

func figureOf(row *api.CompareRow, name string) *api.Float {
	switch name {
	case "gpu_mem_peak_mb":
		return row.GPUMemPeakMB
	case "gpu_mem_mean_mb":
		return row.GPUMemMeanMB
	case "gpu_mem_alloc_peak_mb":
		return row.GPUMemAllocPeakMB
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
	case "comm_ms":
		return row.CommMS
	case "comm_exposed_ms":
		return row.CommExposedMS
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
	if out.Baseline == api.BaselineFirst {
		// Within a sweep: its first trial, the rows being oldest first.
		if len(out.Rows) == 0 {
			out.Baseline = ""
		} else {
			out.Baseline = out.Rows[0].RunID
		}
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

// compareRow computes a run's steady-state figures over every rank (see
// docs/compare.md for what each column means and where it comes from):
// step time, steps/s (steps advanced per second of wall clock between the
// first and last steady step, averaged over ranks) and samples/s (the
// ranks' throughput summed) from the steps; GPU memory and utilisation
// from the steps where the sender measured them per step, else from the
// collector's GPU samples; CPU utilisation from the host samples of the
// run's nodes. A run too short for any sample to fall in its steady state
// keeps its figures from the nearest readings, as Sources and Note say.
func (h *Handler) compareRow(ctx context.Context, r *store.RunRow) (*api.CompareRow, error) {
	var m api.RunMeta
	_ = json.Unmarshal(r.Meta, &m)
	row := &api.CompareRow{RunID: r.RunID, Name: r.Name, Project: r.Project, Status: r.Status, Model: m.Model,
		ZeroStage: m.ZeroStage, Precision: m.Precision, PipelineStages: m.PipelineStages, Parallelism: m.Parallelism,
		OffloadOptim: m.OffloadOptim, OffloadParams: m.OffloadParams, MicroBatch: m.MicroBatch, WorldSize: m.WorldSize,
		Sources: map[string]string{}}
	if row.Precision == "" {
		row.Precision = precisionFromConfig(r.Config)
	}
	if row.Parallelism == "" {
		row.Parallelism = "data"
		if m.PipelineStages != nil && *m.PipelineStages > 1 {
			row.Parallelism = "pipeline"
		}
	}
	sum, err := h.compareSteady(ctx, r.RunID)
	if err != nil {
		return nil, err
	}
	if sum.Ranks > 0 {
		fillSteady(row, &sum, m)
		if err := h.fillMeasured(ctx, r.RunID, m, row, &sum); err != nil {
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
	if row.BestEvalAcc != nil {
		row.Sources["best_eval_accuracy"] = api.SourceEvals
	}
	for _, name := range compareFigures {
		if v := figureOf(row, name); v != nil && row.Sources[name] == "" {
			row.Sources[name] = api.SourceSteps
		}
	}
	// Wasted GPU-hours are computed from steps and GPU samples together
	// (docs/ranks.md); they have no single source.
	w, err := h.wastedOf(ctx, r, &sum)
	if err != nil {
		return nil, err
	}
	total := w.Total
	row.Wasted, row.WastedGPUH = &w, &total
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

// maxOf is the highest value of a figure over the ranks that have it.
func maxOf(agg []store.SteadyRank, get func(store.SteadyRank) *float64) *float64 {
	var out *float64
	for _, a := range agg {
		if v := get(a); v != nil && (out == nil || *v > *out) {
			out = v
		}
	}
	return out
}

// fillSteady sets the figures of the steady steps: timing and throughput,
// the allocator's peak, and GPU memory, GPU and CPU utilisation where the
// sender measured them with each step.
func fillSteady(row *api.CompareRow, s *store.SteadySummary, m api.RunMeta) {
	row.GPUMemMeanMB = fp(scale(s.GPUMemGB, 1000))
	row.GPUMemPeakMB = fp(scale(s.MaxGPUMemUsedGB, 1000))
	row.GPUMemAllocPeakMB = fp(scale(s.AllocPeakGB, 1000))
	row.GPUUtilPct = fp(s.GPUUtil)
	row.StepTimeS = fp(scale(s.StepMS, 1e-3))
	row.StepsPerS = fp(s.StepsPerS)
	if row.StepsPerS == nil && s.StepMS != nil && *s.StepMS > 0 {
		row.StepsPerS = fv(1000 / *s.StepMS)
	}
	sps := s.ThroughputSPS
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
	row.CommMS = fp(s.CommMS)
	row.CommExposedMS = fp(s.CommExposedMS)
	// Per GPU: the mean over ranks, each rank's own GPU.
	row.TFLOPS = fp(s.TFLOPS)
	row.MFU = fp(s.MFU)
}

// steadyWindow is the time range of the steady steps over every rank.
func steadyWindow(agg []store.SteadyRank) (from, to time.Time) {
	for _, a := range agg {
		if from.IsZero() || a.FirstTime.Before(from) {
			from = a.FirstTime
		}
		if a.LastTime.After(to) {
			to = a.LastTime
		}
	}
	return from, to
}

// fillMeasured fills GPU memory and utilisation the steps lacked from the
// GPU samples attributed to the run in the steady window, else from those
// outside it, else (memory) from the hook's allocator peaks; and CPU
// utilisation from the host samples of the run's nodes in the window,
// else just outside it, else from the steps' own cpu_util_pct.
func (h *Handler) fillMeasured(ctx context.Context, runID string, m api.RunMeta, row *api.CompareRow, s *store.SteadySummary) error {
	from, to := s.WindowFrom, s.WindowTo
	var notes []string
	if row.GPUMemMeanMB == nil || row.GPUUtilPct == nil {
		g, err := h.gpuSampleStats(ctx, runID, s.GPU, from, to)
		if err != nil {
			return err
		}
		src := api.SourceGPUSamples
		if g.Samples == 0 && g.UtilSamples == 0 {
			if g, err = h.gpuSampleStats(ctx, runID, s.GPURun, zeroTime, zeroTime); err != nil {
				return err
			}
			src = api.SourceGPUSamplesRun
			if g.Samples > 0 || g.UtilSamples > 0 {
				notes = append(notes, fmt.Sprintf("no GPU sample fell in the steady state (%s): GPU figures from the run's %d samples outside it",
					fmtSpan(from, to), max(g.Samples, g.UtilSamples)))
			}
		}
		if row.GPUMemMeanMB == nil && g.Samples > 0 {
			row.GPUMemMeanMB = fp(scale(g.MeanMemBytes, 1e-6))
			row.GPUMemPeakMB = fp(scale(g.PeakMemBytes, 1e-6))
			row.Sources["gpu_mem_mean_mb"], row.Sources["gpu_mem_peak_mb"] = src, src
		}
		if row.GPUUtilPct == nil && g.UtilSamples > 0 {
			row.GPUUtilPct = fp(g.MeanUtil)
			row.Sources["gpu_util_pct"] = src
		}
	}
	if row.GPUMemMeanMB == nil {
		src, v := api.SourceHookReserved, s.ReservedPeakGB
		if v == nil {
			src, v = api.SourceHookAllocated, s.AllocPeakGB
		}
		if v != nil {
			row.GPUMemMeanMB, row.GPUMemPeakMB = fp(scale(v, 1000)), fp(scale(v, 1000))
			row.Sources["gpu_mem_mean_mb"], row.Sources["gpu_mem_peak_mb"] = src, src
			what := "reserved"
			if src == api.SourceHookAllocated {
				what = "allocated"
			}
			notes = append(notes, "no GPU sample of the run: GPU memory is the hook's allocator peak ("+what+"), below NVML's by the CUDA context")
		}
	}
	if row.GPUUtilPct == nil {
		notes = append(notes, "no GPU sample of the run: no GPU utilisation")
	}
	if err := h.fillHostCPU(ctx, runID, m, row, s, from, to, &notes); err != nil {
		return err
	}
	row.Note = strings.Join(notes, "; ")
	return nil
}

// fillHostCPU sets the CPU column: the host's CPU utilisation on the
// run's nodes (see fillMeasured).
func (h *Handler) fillHostCPU(ctx context.Context, runID string, m api.RunMeta, row *api.CompareRow, s *store.SteadySummary,
	from, to time.Time, notes *[]string) error {
	hosts, err := h.store.RunHosts(ctx, runID, from.Add(-api.CompareNearWindow), to.Add(api.CompareNearWindow))
	if err != nil {
		return err
	}
	if len(hosts) == 0 && m.Host != "" {
		hosts = []string{m.Host}
	}
	c, err := h.store.HostCPU(ctx, hosts, from, to)
	if err != nil {
		return err
	}
	src := api.SourceHostSamples
	if c.Samples == 0 && len(hosts) > 0 {
		if c, err = h.store.HostCPU(ctx, hosts, from.Add(-api.CompareNearWindow), to.Add(api.CompareNearWindow)); err != nil {
			return err
		}
		src = api.SourceHostSamplesNear
		if c.Samples > 0 {
			*notes = append(*notes, fmt.Sprintf("no host sample fell in the steady state: CPU utilisation from %d host samples within %v of it",
				c.Samples, api.CompareNearWindow))
		}
	}
	if c.Samples > 0 {
		row.CPUUtilPct = fp(c.MeanPct)
		row.Sources["cpu_util_pct"] = src
		return nil
	}
	if v := s.CPUUtil; v != nil {
		row.CPUUtilPct = fp(v)
		row.Sources["cpu_util_pct"] = api.SourceSteps
		*notes = append(*notes, "no host sample of the run's nodes: CPU utilisation is the cpu_util_pct the steps carried")
		return nil
	}
	*notes = append(*notes, "no host sample of the run's nodes: no CPU utilisation")
	return nil
}

// gpuSampleStats is known when its summary holds it, else the run's GPU
// samples in [from, to].
func (h *Handler) gpuSampleStats(ctx context.Context, runID string, known *store.GPUSampleStats, from, to time.Time) (*store.GPUSampleStats, error) {
	if known != nil {
		return known, nil
	}
	return h.store.GPUSampleStats(ctx, runID, from, to)
}

// fmtSpan prints a time range as its length.
func fmtSpan(from, to time.Time) string {
	return fmt.Sprintf("%.3g s", to.Sub(from).Seconds())
}
