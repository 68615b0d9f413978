package query

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

var zeroTime time.Time

// defaultGPUMetrics are charted when /gpus names none.
var defaultGPUMetrics = []string{"util_pct", "mem_used_bytes", "power_w", "temp_c"}

func (h *Handler) gpus(ctx context.Context, c echo.Context) (any, error) {
	host, runID := c.QueryParam("host"), c.QueryParam("run_id")
	// rank picks the GPU of one rank (of run_id): the samples the
	// collector attributed to that rank's process.
	rank, err := optIntParam(c, "rank", 0, api.MaxRank)
	if err != nil {
		return nil, err
	}
	sel := store.GPUSelect{Host: host, RunID: runID}
	if rank != nil {
		r := int(*rank)
		sel.Rank = &r
	}
	metrics := multiParam(c, "metric")
	if len(metrics) == 0 {
		metrics = defaultGPUMetrics
	}
	for _, m := range metrics {
		if !store.IsGPUMetric(m) {
			return nil, bad("metric", "unknown GPU metric %q", m)
		}
	}
	maxPoints, err := intParam(c, "max_points", 1000, 1, maxPointsLimit)
	if err != nil {
		return nil, err
	}
	// gpu picks one GPU of the matching hosts; the rows are few (one per
	// bucket and GPU), so it is applied to them rather than in SQL.
	gpu, err := optIntParam(c, "gpu", 0, 1<<20)
	if err != nil {
		return nil, err
	}
	// per_gpu keeps a series per GPU however many: a table of GPUs or a
	// list of hosts needs each GPU's name and host, not their distribution.
	perGPU, err := boolParam(c, "per_gpu")
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	// With a run named, the default window is the whole run; otherwise
	// the last hour.
	defFrom, defTo := now.Add(-time.Hour), now
	if runID != "" {
		defFrom, defTo = time.Unix(0, 0).UTC(), now.Add(24*time.Hour)
	}
	from, err := timeParam(c, "from", defFrom)
	if err != nil {
		return nil, err
	}
	to, err := timeParam(c, "to", defTo)
	if err != nil {
		return nil, err
	}
	if !to.After(from) {
		return nil, bad("to", "must be after from")
	}
	out := api.GPUResponse{Series: []api.GPUSeries{}}
	if done, err := h.gpuMinutes(ctx, metrics, sel, from, to, maxPoints, gpu, &out); err != nil || done {
		return out, err
	}
	first, last, err := h.store.GPUTimeSpan(ctx, sel, from, to)
	if err != nil {
		return nil, err
	}
	if first == nil || last == nil {
		return out, nil
	}
	// Buckets are whole seconds (samples are rarely denser), at least as
	// wide as the span split into max_points.
	span := last.Sub(*first)
	bucket := time.Duration((int64(span)/maxPoints)/int64(time.Second)+1) * time.Second
	if runID != "" && host == "" && rank == nil && gpu == nil && !perGPU {
		spread, err := h.gpuSpread(ctx, metrics, sel, *first, *last, bucket, &out)
		if err != nil || spread {
			return out, err
		}
	}
	series, err := h.store.GPUSeries(ctx, metrics, sel, *first, *last, bucket)
	if err != nil {
		return nil, err
	}
	gpuSeries(&out, metrics, series, gpu)
	return out, nil
}

// gpuSeries appends the rows of each metric to out as a series per GPU,
// those of one GPU only where gpu is set.
func gpuSeries(out *api.GPUResponse, metrics []string, series map[string][]store.GPUSeriesRow, gpu *int64) {
	for _, m := range metrics {
		rows := series[m]
		var cur *api.GPUSeries
		for _, r := range rows {
			if gpu != nil && int64(r.GPU) != *gpu {
				continue
			}
			if cur == nil || cur.Host != r.Host || cur.GPU != r.GPU {
				out.Series = append(out.Series, api.GPUSeries{Host: r.Host, GPU: r.GPU, Metric: m, Unit: gpuUnit(m), Points: []api.TimePoint{}})
				cur = &out.Series[len(out.Series)-1]
			}
			cur.UUID, cur.Name, cur.RunID = r.UUID, r.Name, r.RunID
			cur.Points = append(cur.Points, api.TimePoint{Time: r.Time, Value: api.Float(r.Mean), Min: api.Float(r.Min), Max: api.Float(r.Max)})
		}
	}
}

// gpuSpread answers a run's GPUs, when they are more than
// api.MaxRankSeries, as each metric's distribution over them: a line per
// GPU of a thousand GPUs is neither readable nor bounded. It reports
// whether it did.
func (h *Handler) gpuSpread(ctx context.Context, metrics []string, sel store.GPUSelect, from, to time.Time, bucket time.Duration, out *api.GPUResponse) (bool, error) {
	n, err := h.store.CountGPUs(ctx, sel, from, to)
	if err != nil {
		return false, err
	}
	return h.gpuSpreadOf(ctx, n, metrics, sel, from, to, bucket, h.store.GPUSpread, out)
}

// gpuSpreadOf is gpuSpread for n GPUs, each metric's distribution read by
// spread (from the samples or from the minute rollups).
func (h *Handler) gpuSpreadOf(ctx context.Context, n int, metrics []string, sel store.GPUSelect, from, to time.Time, bucket time.Duration,
	spread func(context.Context, string, store.GPUSelect, time.Time, time.Time, time.Duration) ([]store.GPUSpreadRow, error), out *api.GPUResponse) (bool, error) {
	if n <= api.MaxRankSeries {
		return false, nil
	}
	for _, m := range metrics {
		if m == "xid_last" || m == "throttle_reasons" {
			return false, nil // no distribution of a code or a mask
		}
	}
	for _, m := range metrics {
		rows, err := spread(ctx, m, sel, from, to, bucket)
		if err != nil {
			return false, err
		}
		sp := api.SeriesSpread{Metric: m, Unit: gpuUnit(m), Points: make([]api.SpreadPoint, 0, len(rows))}
		for _, r := range rows {
			sp.Points = append(sp.Points, api.SpreadPoint{Time: r.Time, Min: api.Float(r.Min), P5: api.Float(r.P5),
				Median: api.Float(r.Median), P95: api.Float(r.P95), Max: api.Float(r.Max), Mean: api.Float(r.Mn), Ranks: r.GPUs})
		}
		out.Spread = append(out.Spread, sp)
	}
	out.Notice = fmt.Sprintf("%d GPUs: each chart shows their distribution (median, 5th to 95th percentile, lowest to highest) instead of a line per GPU", n)
	return true, nil
}

const maxAnnotations = 10000

func (h *Handler) annotations(ctx context.Context, c echo.Context) (any, error) {
	runID := c.QueryParam("run_id")
	from, err := timeParam(c, "from", time.Unix(0, 0).UTC())
	if err != nil {
		return nil, err
	}
	to, err := timeParam(c, "to", time.Now().UTC().Add(24*time.Hour))
	if err != nil {
		return nil, err
	}
	if to.Before(from) {
		return nil, bad("to", "must not be before from")
	}
	types, err := eventTypes(c)
	if err != nil {
		return nil, err
	}
	if runID != "" {
		if _, err := h.store.GetRun(ctx, runID); err != nil {
			if err == store.ErrNotFound {
				return nil, &notFound{what: fmt.Sprintf("run %q", runID)}
			}
			return nil, err
		}
	}
	out := api.AnnotationsResponse{Annotations: []api.Annotation{}}
	var evs []store.EventRow
	if len(types) == 0 {
		evs, err = h.store.Events(ctx, runID, from, to, maxAnnotations)
	} else {
		evs, err = h.store.EventsOfTypes(ctx, runID, from, to, types, maxAnnotations)
	}
	if err != nil {
		return nil, err
	}
	for _, e := range evs {
		a := api.Annotation{RunID: e.RunID, Time: e.Time, Type: e.Type, Text: e.Text, Tags: []string{e.Type, e.RunID}}
		if e.Step >= 0 {
			s := e.Step
			a.Step = &s
			a.Title = fmt.Sprintf("%s at step %d", e.Type, e.Step)
		} else {
			a.Title = e.Type
		}
		out.Annotations = append(out.Annotations, a)
	}
	if err := h.summarizeHangs(ctx, out.Annotations, evs); err != nil {
		return nil, err
	}
	// Alerts and evaluations live in their own tables.
	if len(types) == 0 || slices.Contains(types, alertType) {
		als, err := h.store.AlertAnnotations(ctx, runID, from, to, maxAnnotations)
		if err != nil {
			return nil, err
		}
		for _, a := range als {
			title := "alert: " + a.Kind
			if a.Rank != nil {
				title += fmt.Sprintf(" on rank %d", *a.Rank)
			}
			text := a.Text
			if a.ResolvedAt != nil {
				text += " (resolved " + a.ResolvedAt.UTC().Format(time.RFC3339) + ")"
			}
			out.Annotations = append(out.Annotations, api.Annotation{RunID: a.RunID, Time: a.At, Step: a.Step, Type: alertType,
				Title: title, Text: text, Tags: []string{alertType, a.Kind, a.RunID}})
		}
	}
	if len(types) > 0 && !slices.Contains(types, evalType) {
		sortAnnotations(out.Annotations)
		return out, nil
	}
	evals, ids, err := h.store.EvalEvents(ctx, runID, from, to, maxAnnotations)
	if err != nil {
		return nil, err
	}
	for i, e := range evals {
		s := e.Step
		text := ""
		add := func(name string, v *float64) {
			if v != nil {
				if text != "" {
					text += ", "
				}
				text += fmt.Sprintf("%s %.4g", name, *v)
			}
		}
		add("loss", e.Loss)
		add("accuracy", e.Accuracy)
		add("f1", e.F1)
		out.Annotations = append(out.Annotations, api.Annotation{RunID: ids[i], Time: e.Time, Step: &s, Type: "eval",
			Title: fmt.Sprintf("eval (%s) at step %d", e.Split, e.Step), Text: text, Tags: []string{"eval", ids[i]}})
	}
	sortAnnotations(out.Annotations)
	return out, nil
}

func sortAnnotations(a []api.Annotation) {
	sort.SliceStable(a, func(i, j int) bool { return a[i].Time.Before(a[j].Time) })
}
