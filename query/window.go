package query

import (
	"context"
	"fmt"
	"time"

	"github.com/labstack/echo/v4"
)

// timeWindow reads the optional from and to of a step chart: Grafana's
// time range. Either may be absent; absent both, the chart is not
// restricted by time.
type timeWindow struct {
	from, to *time.Time
}

func (w timeWindow) set() bool { return w.from != nil || w.to != nil }

func windowParams(c echo.Context) (timeWindow, error) {
	var w timeWindow
	for _, p := range []struct {
		name string
		dst  **time.Time
	}{{"from", &w.from}, {"to", &w.to}} {
		if c.QueryParam(p.name) == "" {
			continue
		}
		t, err := timeParam(c, p.name, time.Time{})
		if err != nil {
			return w, err
		}
		*p.dst = &t
	}
	if w.from != nil && w.to != nil && w.to.Before(*w.from) {
		return w, bad("to", "must not be before from")
	}
	return w, nil
}

// stepsInWindow narrows [first, last], a rank's recorded steps, to the
// steps whose time falls in w. ok is false when none does.
//
// A rank's step times grow with the step (a redone step replaces the
// older row, with a newer time), so each edge is found by a binary search
// over the step number; every probe is one lookup in the steps table's
// (run_id, rank, step, time) index. A 1,000,000-step run takes about 40
// probes for both edges, where a scan of the run's rows by time would read
// them all.
func (h *Handler) stepsInWindow(ctx context.Context, runID string, rank int, first, last int64, w timeWindow) (from, to int64, ok bool, err error) {
	from, to = first, last
	if w.from != nil {
		// The smallest s whose next recorded step is at or after w.from.
		lo, hi := first, last+1
		for lo < hi {
			mid := lo + (hi-lo)/2
			_, t, found, err := h.stepNear(ctx, runID, rank, mid, true)
			if err != nil {
				return 0, 0, false, err
			}
			if !found || !t.Before(*w.from) {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		if lo > last {
			return 0, 0, false, nil
		}
		s, _, found, err := h.stepNear(ctx, runID, rank, lo, true)
		if err != nil || !found {
			return 0, 0, false, err
		}
		from = s
	}
	if w.to != nil {
		// The largest s whose previous recorded step is at or before w.to.
		lo, hi := first-1, last
		for lo < hi {
			mid := hi - (hi-lo)/2
			_, t, found, err := h.stepNear(ctx, runID, rank, mid, false)
			if err != nil {
				return 0, 0, false, err
			}
			if !found || t.After(*w.to) {
				hi = mid - 1
			} else {
				lo = mid
			}
		}
		if lo < first {
			return 0, 0, false, nil
		}
		s, _, found, err := h.stepNear(ctx, runID, rank, lo, false)
		if err != nil || !found {
			return 0, 0, false, err
		}
		to = s
	}
	return from, to, from <= to, nil
}

// stepNear returns the first recorded step at or after s (after true), or
// the last one at or before s, with its time.
func (h *Handler) stepNear(ctx context.Context, runID string, rank int, s int64, after bool) (step int64, t time.Time, found bool, err error) {
	step, t, found, err = h.store.StepNear(ctx, runID, rank, s, after)
	if err != nil {
		return 0, time.Time{}, false, fmt.Errorf("query: %w", err)
	}
	return step, t, found, nil
}
