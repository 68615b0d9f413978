package plugin

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// seriesQuery is a run's series, from GET /runs/{id}/series; a query of
// every rank also asks which ranks are stragglers, to name their series.
var seriesQuery = queryFunc(func(ctx context.Context, d *Datasource, r request) (data.Frames, error) {
	var s api.SeriesResponse
	if err := d.client.get(ctx, runPath(r.RunID, "series"), url.Values(seriesParams(r)), &s); err != nil {
		return nil, err
	}
	return seriesFrames(r.PluginQuery, s, d.flaggedRanks(ctx, r.PluginQuery)), nil
})

// seriesParams are the parameters of GET /runs/{id}/series.
func seriesParams(r request) params {
	p := params{}
	p.add("metric", r.Metrics)
	p.set("rank", r.Rank)
	p.step("from_step", r.FromStep)
	p.step("to_step", r.ToStep)
	p.maxPoints(r.maxDataPoints)
	// On the step axis the whole run is wanted whatever the dashboard's
	// time picker says; on the time axis the picker rules.
	if r.XAxis != "step" {
		p.timeRange(r.timeRange)
	}
	return p
}

// seriesFrames gives one frame per metric and rank: x (time, or step for
// the trend panel), the value, and optionally the bucket's min and max.
// On a run of more than api.MaxRankSeries ranks, rank=all answers the
// ranks' distribution (spreadFrames, first) and the series of the ranks
// the server picked; its notice says so on the first frame. The series of
// a rank in flagged end their display name with StragglerSuffix.
func seriesFrames(q api.PluginQuery, r api.SeriesResponse, flagged map[int]bool) data.Frames {
	ranks := map[int]bool{}
	for _, s := range r.Series {
		ranks[s.Rank] = true
	}
	perRank := q.Rank == "all" || len(ranks) > 1
	frames := spreadFrames(q, r)
	for _, s := range r.Series {
		display := api.MetricLabel(s.Metric)
		if perRank {
			display = fmt.Sprintf("%s rank %d", display, s.Rank)
			if flagged[s.Rank] {
				display += api.StragglerSuffix
			}
		}
		unit := metricUnit(s.Metric, s.Unit)
		labels := data.Labels{"rank": strconv.Itoa(s.Rank)}
		n := len(s.Points)
		val, lo, hi := make([]float64, n), make([]float64, n), make([]float64, n)
		for i, p := range s.Points {
			val[i], lo[i], hi[i] = float64(p.Value), float64(p.Min), float64(p.Max)
		}
		fields := []*data.Field{xField(q.XAxis, s.Points)}
		if q.WithStep && q.XAxis != "step" {
			fields = append(fields, stepField(s.Points))
		}
		fields = append(fields, data.NewField(s.Metric, labels, val).SetConfig(&data.FieldConfig{Unit: unit, DisplayNameFromDS: display}))
		if marks := nonFiniteMarks(val); marks != nil {
			fields = append(fields, data.NewField(s.Metric+"_non_finite", labels, marks).
				SetConfig(&data.FieldConfig{Unit: unit, DisplayNameFromDS: display + api.NonFiniteSuffix}))
		}
		if q.MinMax {
			fields = append(fields,
				data.NewField(s.Metric+"_min", labels, lo).SetConfig(&data.FieldConfig{Unit: unit, DisplayNameFromDS: display + " min"}),
				data.NewField(s.Metric+"_max", labels, hi).SetConfig(&data.FieldConfig{Unit: unit, DisplayNameFromDS: display + " max"}))
		}
		f := data.NewFrame(display, fields...)
		if q.XAxis != "step" && !q.MinMax && !q.WithStep {
			f.Meta = timeSeriesMeta()
		} else {
			f.Meta = &data.FrameMeta{}
		}
		f.Meta.Custom = map[string]any{"bucket_steps": s.BucketSteps}
		frames = append(frames, f)
	}
	return withNotice(frames, "series", r.Notice)
}

// nonFiniteMarks marks where a series is NaN or infinite, which a line
// chart leaves as a gap: a point at the last finite value before it (0
// when none), nothing elsewhere, so the chart can draw it as a red dot
// with the line. Nil when every value is finite.
func nonFiniteMarks(val []float64) []*float64 {
	var marks []*float64
	last := 0.0
	for i, v := range val {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			last = v
			continue
		}
		if marks == nil {
			marks = make([]*float64, len(val))
		}
		at := last
		marks[i] = &at
	}
	return marks
}

// stepField is the step of each point beside a time axis: shown in the
// tooltip and hidden from the chart, its legend and its axes (Grafana
// draws an axis for a number field hidden from the chart unless its axis
// is hidden too: GPU memory per rank had a step axis beside its own), so
// a time chart can be read by step.
func stepField(pts []api.Point) *data.Field {
	v := make([]int64, len(pts))
	for i, p := range pts {
		v[i] = p.Step
	}
	return data.NewField("step", nil, v).SetConfig(&data.FieldConfig{
		DisplayNameFromDS: "Step",
		Unit:              "none",
		Custom: map[string]any{"hideFrom": map[string]any{"viz": true, "legend": true, "tooltip": false},
			"axisPlacement": "hidden"},
	})
}

func xField(axis string, pts []api.Point) *data.Field {
	if axis == "step" {
		v := make([]int64, len(pts))
		for i, p := range pts {
			v[i] = p.Step
		}
		// Labelled as the trend panels' x field and join key name it.
		return data.NewField("step", nil, v).SetConfig(&data.FieldConfig{DisplayNameFromDS: "Step", Unit: "none"})
	}
	v := make([]time.Time, len(pts))
	for i, p := range pts {
		v[i] = p.Time
	}
	return data.NewField("time", nil, v)
}

// flaggedRanks are the ranks GET /runs/{id}/ranks flags as stragglers,
// for a query of every rank's series: their series are named so a panel
// override (StragglerSuffix) can highlight them. Nil for one rank's
// series, or when the server cannot say (the series still draw).
func (d *Datasource) flaggedRanks(ctx context.Context, q api.PluginQuery) map[int]bool {
	if q.Rank != "all" {
		return nil
	}
	var rr api.RanksResponse
	if err := d.client.get(ctx, runPath(q.RunID, "ranks"), nil, &rr); err != nil {
		return nil
	}
	var out map[int]bool
	for _, r := range rr.Ranks {
		if r.Straggler {
			if out == nil {
				out = map[int]bool{}
			}
			out[r.Rank] = true
		}
	}
	return out
}
