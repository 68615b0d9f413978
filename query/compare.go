package query

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
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
	rows, err := h.compareRows(ctx, runs)
	if err != nil {
		return nil, err
	}
	out := api.CompareResponse{Baseline: c.QueryParam("baseline"), Rows: rows}
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
		rows, err := h.compareRows(ctx, []*store.RunRow{br})
		if err != nil {
			return nil, err
		}
		base = &rows[0]
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
