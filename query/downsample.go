package query

import (
	"context"
	"math"
	"time"

	"github.com/deepseed/deepseed/store"
)

// plan is how a step range is cut into aligned buckets: bucket k covers
// steps [k*Width, (k+1)*Width). Rollup is the stored rollup width read for
// whole rollup buckets, 0 when only raw rows are read.
type plan struct {
	From, To int64
	Width    int64
	Rollup   int64
}

// maxRawSpan is the most steps a series or heatmap reads row by row: a
// longer span is read from rollups of at least 100 steps, so a chart's
// work stays within about 10,000 rows whatever max_points asks.
const maxRawSpan = 10000

// planBuckets picks the narrowest aligned bucket width that cuts
// [from, to] into at most maxPoints buckets (and no narrower than 100
// steps past maxRawSpan). From 100 steps per bucket on,
// the width is a multiple of the widest rollup width that fits, so whole
// rollup buckets compose each output bucket.
func planBuckets(from, to int64, maxPoints int) plan {
	p := plan{From: from, To: to}
	span := to - from + 1
	w := (span + int64(maxPoints) - 1) / int64(maxPoints)
	if w < 1 {
		w = 1
	}
	count := func(w int64) int64 { return to/w - from/w + 1 }
	var r int64
	for _, rw := range store.RollupWidths {
		if w >= rw {
			r = rw
		}
	}
	// A span too long to read row by row is cut into rollup buckets even
	// when that leaves fewer than maxPoints of them.
	if r == 0 && span > maxRawSpan {
		r, w = store.RollupWidths[0], store.RollupWidths[0]
	}
	step := int64(1)
	if r > 0 {
		w = (w + r - 1) / r * r
		step = r
	}
	for count(w) > int64(maxPoints) {
		w += step
	}
	p.Width, p.Rollup = w, r
	return p
}

// acc accumulates one bucket. min and max follow PostgreSQL's float
// ordering, where NaN sorts above every number: max is NaN when any value
// is, min only when all are. The sum is IEEE (NaN and opposite infinities
// make it NaN), so raw and rolled-up reads agree.
type acc struct {
	firstStep int64
	firstTime time.Time
	min, max  float64
	sum       float64
	count     int64
}

func pgLess(a, b float64) bool {
	if math.IsNaN(a) {
		return false
	}
	if math.IsNaN(b) {
		return true
	}
	return a < b
}

func (a *acc) add(step int64, t time.Time, mn, mx, sum float64, n int64) {
	if n == 0 {
		return
	}
	if a.count == 0 {
		*a = acc{firstStep: step, firstTime: t, min: mn, max: mx, sum: sum, count: n}
		return
	}
	if step < a.firstStep {
		a.firstStep, a.firstTime = step, t
	}
	if pgLess(mn, a.min) {
		a.min = mn
	}
	if pgLess(a.max, mx) {
		a.max = mx
	}
	a.sum += sum
	a.count += n
}

// slots is the number of output buckets of the plan.
func (p plan) slots() int64 { return p.To/p.Width - p.From/p.Width + 1 }

// slot returns the element of s, one per output bucket of p, that holds
// step, or nil for a step outside them.
func slot[T any](p plan, s []T, step int64) *T {
	i := step/p.Width - p.From/p.Width
	if i < 0 || i >= int64(len(s)) {
		return nil
	}
	return &s[i]
}

// buckets is the dense slice of output buckets of a plan.
type buckets struct {
	p plan
	b []acc
}

func newBuckets(p plan) *buckets {
	return &buckets{p: p, b: make([]acc, p.slots())}
}

func (bs *buckets) at(step int64) *acc { return slot(bs.p, bs.b, step) }

// rollupRange returns the whole rollup buckets inside [From, To] as an
// index range [rf, rt]. ok is false when no whole rollup bucket fits.
func (p plan) rollupRange() (rf, rt int64, ok bool) {
	r := p.Rollup
	rf = (p.From + r - 1) / r
	rt = (p.To+1)/r - 1
	return rf, rt, rf <= rt
}

// read reads the plan's steps in step order: the whole rollup buckets
// [rf, rt] inside it through rollups, where the plan has a rollup width
// and one fits, and the raw steps left at both edges (all of them
// otherwise) through raw, never called for an empty range.
func (p plan) read(raw func(from, to int64) error, rollups func(rf, rt int64) error) error {
	rawRange := func(from, to int64) error {
		if from > to {
			return nil
		}
		return raw(from, to)
	}
	if p.Rollup == 0 {
		return rawRange(p.From, p.To)
	}
	rf, rt, ok := p.rollupRange()
	if !ok {
		return rawRange(p.From, p.To)
	}
	if err := rawRange(p.From, rf*p.Rollup-1); err != nil {
		return err
	}
	if err := rollups(rf, rt); err != nil {
		return err
	}
	return rawRange((rt+1)*p.Rollup, p.To)
}

// seriesBuckets downsamples one metric of one rank over the plan, reading
// whole rollup buckets where the plan has a rollup width and raw rows for
// everything else.
func (h *Handler) seriesBuckets(ctx context.Context, runID string, rank int, metric string, p plan) (*buckets, error) {
	bs := newBuckets(p)
	err := p.read(func(from, to int64) error {
		pts, err := h.store.SeriesRaw(ctx, runID, rank, metric, from, to)
		if err != nil {
			return err
		}
		for _, pt := range pts {
			if a := bs.at(pt.Step); a != nil {
				a.add(pt.Step, pt.Time, pt.Value, pt.Value, pt.Value, 1)
			}
		}
		return nil
	}, func(rf, rt int64) error {
		rows, err := h.store.MetricRollups(ctx, runID, rank, metric, p.Rollup, rf, rt)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if a := bs.at(r.Bucket * p.Rollup); a != nil {
				a.add(r.FirstStep, r.FirstTime, r.Min, r.Max, r.Sum, r.Count)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return bs, nil
}

// layerAcc accumulates one heatmap column.
type layerAcc struct {
	firstStep int64
	firstTime time.Time
	rows      int64
	sums      []float64
	counts    []int64
}

func (a *layerAcc) add(step int64, t time.Time, sums []*float64, counts []int64, nlayers int) {
	if a.sums == nil {
		a.sums = make([]float64, nlayers)
		a.counts = make([]int64, nlayers)
		a.firstStep, a.firstTime = step, t
	}
	if step < a.firstStep {
		a.firstStep, a.firstTime = step, t
	}
	a.rows++
	for i := 0; i < len(sums) && i < nlayers; i++ {
		n := int64(1)
		if counts != nil {
			n = counts[i]
		}
		if sums[i] == nil || n == 0 {
			continue
		}
		a.sums[i] += *sums[i]
		a.counts[i] += n
	}
}

// heatmapColumns accumulates per-layer timings of one pass over the plan.
func (h *Handler) heatmapColumns(ctx context.Context, runID string, rank int, p plan, backward bool, nlayers int) ([]layerAcc, error) {
	cols := make([]layerAcc, p.slots())
	err := p.read(func(from, to int64) error {
		rows, err := h.store.LayersRaw(ctx, runID, rank, from, to, backward)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if a := slot(p, cols, r.Step); a != nil {
				a.add(r.Step, r.Time, r.Sums, nil, nlayers)
			}
		}
		return nil
	}, func(rf, rt int64) error {
		rows, err := h.store.LayerRollups(ctx, runID, rank, p.Rollup, rf, rt, backward)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if a := slot(p, cols, r.Bucket*p.Rollup); a != nil {
				a.add(r.Step, r.Time, r.Sums, r.Counts, nlayers)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return cols, nil
}
