package query

import (
	"context"
	"math"

	"github.com/deepseed/deepseed/internal/stats"
	"github.com/deepseed/deepseed/store"
)

// Steady-state detection. The first steps of a run are slow (CUDA context,
// allocator warm-up, compilation, data-loader start); averaging them in
// would skew every comparison. The steady state starts once a trailing
// rolling median of the step time stays within steadyTol of the run's
// overall median; leading outliers after that point are skipped too.
const steadyTol = 0.15

// steadyStart returns the first step of the steady state of pts (step
// order). Only the first half of the run is searched, so a slow phase at
// the end cannot push the start past the middle.
func steadyStart(pts []store.RawPoint) int64 {
	var xs []store.RawPoint
	for _, p := range pts {
		if !math.IsNaN(p.Value) && !math.IsInf(p.Value, 0) && p.Value > 0 {
			xs = append(xs, p)
		}
	}
	if len(xs) == 0 {
		if len(pts) > 0 {
			return pts[0].Step
		}
		return 0
	}
	if len(xs) < 10 {
		return xs[0].Step
	}
	vals := make([]float64, len(xs))
	for i, p := range xs {
		vals[i] = p.Value
	}
	m := stats.Median(vals)
	tol := steadyTol * m
	w := len(xs) / 20
	w = max(5, min(w, 50))
	half := len(xs) / 2
	start := 0
	win := make([]float64, 0, w)
	for i := w - 1; i < half; i++ {
		win = append(win[:0], vals[i-w+1:i+1]...)
		if math.Abs(stats.Median(win)-m) > tol {
			start = i + 1
		}
	}
	for start < half && math.Abs(vals[start]-m) > tol {
		start++
	}
	return xs[start].Step
}

// steadyFrom returns the steady state's first step of a rank of a run.
func (h *Handler) steadyFrom(ctx context.Context, runID string, rank int) (int64, error) {
	if err := h.refreshRollups(ctx, runID); err != nil {
		return 0, err
	}
	pts, err := h.store.StepMSTimeline(ctx, runID, rank, store.RawRankSteps)
	if err != nil {
		return 0, err
	}
	return steadyStart(pts), nil
}
