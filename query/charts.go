package query

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

const maxPointsLimit = 10000

func validMetric(m string) bool {
	if name, ok := strings.CutPrefix(m, "metrics."); ok {
		return name != "" && len(name) <= api.MaxIDLen
	}
	return store.IsStepMetric(m) || store.IsRankMetric(m) || m == "skipped"
}

// stepRange reads from_step and to_step, defaulting to the span recorded.
func stepRange(c echo.Context, first, last int64) (int64, int64, error) {
	from, err := intParam(c, "from_step", first, 0, api.MaxStep)
	if err != nil {
		return 0, 0, err
	}
	to, err := intParam(c, "to_step", last, 0, api.MaxStep)
	if err != nil {
		return 0, 0, err
	}
	if to < from {
		return 0, 0, bad("to_step", "must not be below from_step")
	}
	return max(from, first), min(to, last), nil
}

func (h *Handler) series(ctx context.Context, c echo.Context) (any, error) {
	r, err := h.run(ctx, c)
	if err != nil {
		return nil, err
	}
	metrics := multiParam(c, "metric")
	if len(metrics) == 0 {
		metrics = []string{"loss"}
	}
	if len(metrics) > 32 {
		return nil, bad("metric", "at most 32 metrics")
	}
	for _, m := range metrics {
		if !validMetric(m) {
			return nil, bad("metric", "unknown metric %q: want a step metric (loss, lr, step_ms, …), lateness_ms, straggler_score or metrics.NAME", m)
		}
	}
	maxPoints, err := intParam(c, "max_points", 1000, 1, maxPointsLimit)
	if err != nil {
		return nil, err
	}
	all, named, err := rankAll(c)
	if err != nil {
		return nil, err
	}
	top, err := intParam(c, "top", 3, 0, maxTopRanks)
	if err != nil {
		return nil, err
	}
	var ranks []int
	if all {
		if ranks, err = h.store.RunRanks(ctx, r.RunID); err != nil {
			return nil, err
		}
		if len(ranks) > api.MaxRankSeries {
			window, err := windowParams(c)
			if err != nil {
				return nil, err
			}
			if _, _, err := stepRange(c, 0, api.MaxStep); err != nil {
				return nil, err
			}
			return h.spreadSeries(ctx, c, r, metrics, ranks, named, int(top), int(maxPoints), window)
		}
	} else {
		rank, err := h.rankParam(ctx, c, r.RunID)
		if err != nil {
			return nil, err
		}
		ranks = []int{rank}
	}
	// Validate the step range and time window before touching the data.
	if _, _, err := stepRange(c, 0, api.MaxStep); err != nil {
		return nil, err
	}
	window, err := windowParams(c)
	if err != nil {
		return nil, err
	}
	refreshed := false
	across := newRankSeries(h, r)
	out := api.SeriesResponse{RunID: r.RunID, MaxPoints: int(maxPoints), Series: []api.Series{}}
	// The lag is read before the data: the answer is at least as fresh as
	// it says.
	if out.ReplicaLagS, err = h.replicaLag(ctx, c, r); err != nil {
		return nil, err
	}
	for _, rank := range ranks {
		first, last, ok, err := h.store.StepSpan(ctx, r.RunID, rank)
		if err != nil {
			return nil, err
		}
		// A time window (Grafana zoomed in) narrows the steps before they
		// are cut into buckets, so the buckets get finer as the window
		// shrinks and rollups still serve the whole buckets inside it.
		if ok && window.set() {
			if first, last, ok, err = h.stepsInWindow(ctx, r.RunID, rank, first, last, window); err != nil {
				return nil, err
			}
		}
		for _, m := range metrics {
			s := api.Series{Metric: m, Rank: rank, Unit: metricUnits[m], Points: []api.Point{}}
			if !ok {
				out.Series = append(out.Series, s)
				continue
			}
			from, to, _ := stepRange(c, first, last)
			if from > to {
				out.Series = append(out.Series, s)
				continue
			}
			p := planBuckets(from, to, int(maxPoints))
			var bs *buckets
			if p.Rollup > 0 && !refreshed {
				if err := h.refreshRollups(ctx, r.RunID); err != nil {
					return nil, err
				}
				refreshed = true
			}
			switch {
			case m == "lateness_ms" && p.Rollup > 0:
				// Rolled up block by block (store.SyncMetrics): a long run's
				// lateness is not recomputed from every rank's rows.
				bs, err = h.rollupBuckets(ctx, r.RunID, rank, m, p)
			case store.IsRankMetric(m):
				bs, err = across.buckets(ctx, rank, m, p)
			default:
				bs, err = h.seriesBuckets(ctx, r.RunID, rank, m, p)
			}
			if err != nil {
				return nil, err
			}
			out.Series = append(out.Series, seriesOf(m, rank, p, bs))
		}
	}
	return out, nil
}

func (h *Handler) heatmap(ctx context.Context, c echo.Context) (any, error) {
	r, err := h.run(ctx, c)
	if err != nil {
		return nil, err
	}
	pass := c.QueryParam("pass")
	if pass == "" {
		pass = "forward"
	}
	if pass != "forward" && pass != "backward" {
		return nil, bad("pass", "want forward or backward, got %q", pass)
	}
	maxSteps, err := intParam(c, "max_steps", 500, 1, maxPointsLimit)
	if err != nil {
		return nil, err
	}
	rank, err := h.rankParam(ctx, c, r.RunID)
	if err != nil {
		return nil, err
	}
	if _, _, err := stepRange(c, 0, api.MaxStep); err != nil {
		return nil, err
	}
	out := api.Heatmap{RunID: r.RunID, Pass: pass, Rank: rank, Layers: r.LayerNames,
		Steps: []int64{}, Times: []time.Time{}, Values: [][]*api.Float{}}
	if out.Layers == nil {
		out.Layers = []string{}
	}
	first, last, ok, err := h.store.LayerSpan(ctx, r.RunID, rank)
	if err != nil {
		return nil, err
	}
	if !ok || len(r.LayerNames) == 0 {
		out.Notice = fmt.Sprintf("no layer timings for rank %d of this run", rank)
		if why := layerTimesNote(r.Meta); why != "" {
			out.Notice = "no per-layer times in this run: " + why
		}
		return out, nil
	}
	from, to, _ := stepRange(c, first, last)
	if from > to {
		return out, nil
	}
	p := planBuckets(from, to, int(maxSteps))
	if p.Rollup > 0 {
		if err := h.refreshRollups(ctx, r.RunID); err != nil {
			return nil, err
		}
	}
	n := len(r.LayerNames)
	cols, err := h.heatmapColumns(ctx, r.RunID, rank, p, pass == "backward", n)
	if err != nil {
		return nil, err
	}
	out.BucketSteps = p.Width
	out.Values = make([][]*api.Float, n)
	for i := range out.Values {
		out.Values[i] = []*api.Float{}
	}
	// Layer records may carry one pass only (an export without backward
	// times): say so rather than answer columns of nulls.
	if !anyCell(cols, n) {
		out.Notice = fmt.Sprintf("no %s timings: this run's layer records have none for rank %d", pass, rank)
		return out, nil
	}
	for _, col := range cols {
		if col.sums == nil {
			continue
		}
		out.Steps = append(out.Steps, col.firstStep)
		out.Times = append(out.Times, col.firstTime)
		for i := 0; i < n; i++ {
			var v *api.Float
			if col.counts[i] > 0 {
				v = fv(col.sums[i] / float64(col.counts[i]))
			}
			out.Values[i] = append(out.Values[i], v)
		}
	}
	return out, nil
}

// anyCell reports whether any column holds a timing for any layer.
func anyCell(cols []layerAcc, n int) bool {
	for _, col := range cols {
		for i := 0; i < n && i < len(col.counts); i++ {
			if col.counts[i] > 0 {
				return true
			}
		}
	}
	return false
}

func (h *Handler) evals(ctx context.Context, c echo.Context) (any, error) {
	r, err := h.run(ctx, c)
	if err != nil {
		return nil, err
	}
	rows, err := h.store.Evals(ctx, r.RunID)
	if err != nil {
		return nil, err
	}
	out := api.EvalsResponse{RunID: r.RunID, Evals: []api.EvalPoint{}}
	for _, e := range rows {
		p := api.EvalPoint{Step: e.Step, Time: e.Time, Split: e.Split, Loss: fp(e.Loss), Accuracy: fp(e.Accuracy),
			F1: fp(e.F1), TrainLoss: fp(e.TrainLoss)}
		if len(e.Metrics) > 0 {
			var m map[string]api.Float
			if json.Unmarshal(e.Metrics, &m) == nil && len(m) > 0 {
				p.Metrics = m
			}
		}
		out.Evals = append(out.Evals, p)
	}
	return out, nil
}

// layerTimesNote is why a run has no layer times when its hook said so:
// the layer_times sentence of its meta ("unavailable: the model is
// compiled whole (torch.compile) …"), without the "unavailable: ".
func layerTimesNote(meta json.RawMessage) string {
	var m struct {
		LayerTimes string `json:"layer_times"`
	}
	if json.Unmarshal(meta, &m) != nil {
		return ""
	}
	return strings.TrimPrefix(strings.TrimSpace(m.LayerTimes), "unavailable: ")
}
