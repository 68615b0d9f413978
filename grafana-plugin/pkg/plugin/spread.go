package plugin

import (
	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// spreadFrames gives one frame per metric of a distribution over the
// ranks (rank=all past api.MaxRankSeries ranks): x, then the lowest, 5th
// percentile, median, 95th percentile and highest of the ranks' means in
// each bucket, shown as SpreadLabel(metric, quantile). A time series
// panel draws them as a band with fill-below-to overrides.
func spreadFrames(q api.PluginQuery, r api.SeriesResponse) data.Frames {
	frames := make(data.Frames, 0, len(r.Spread))
	for _, sp := range r.Spread {
		n := len(sp.Points)
		// The x fields are built from the points' step and time.
		pts := make([]api.Point, n)
		for i, p := range sp.Points {
			pts[i] = api.Point{Step: p.Step, Time: p.Time}
		}
		fields := []*data.Field{xField(q.XAxis, pts)}
		if q.WithStep && q.XAxis != "step" {
			fields = append(fields, stepField(pts))
		}
		unit := metricUnit(sp.Metric, sp.Unit)
		for _, quantile := range api.SpreadQuantiles {
			v := make([]float64, n)
			for i, p := range sp.Points {
				v[i] = float64(spreadValue(p, quantile))
			}
			fields = append(fields, data.NewField(sp.Metric+"_"+quantile, data.Labels{"quantile": quantile}, v).
				SetConfig(&data.FieldConfig{Unit: unit, DisplayNameFromDS: api.SpreadLabel(sp.Metric, quantile)}))
		}
		f := data.NewFrame(sp.Metric+" over ranks", fields...)
		f.Meta = &data.FrameMeta{Custom: map[string]any{"bucket_steps": sp.BucketSteps, "ranks": r.Ranks}}
		frames = append(frames, f)
	}
	return frames
}

// spreadValue is one quantile of a bucket.
func spreadValue(p api.SpreadPoint, quantile string) api.Float {
	switch quantile {
	case api.SpreadMin:
		return p.Min
	case api.SpreadP5:
		return p.P5
	case api.SpreadMedian:
		return p.Median
	case api.SpreadP95:
		return p.P95
	}
	return p.Max
}

// withNotice puts the server's notice on the first frame, where Grafana
// shows it in the panel's header; a query that answered no frame gets an
// empty one to carry it.
func withNotice(frames data.Frames, name, notice string) data.Frames {
	if notice == "" {
		return frames
	}
	if len(frames) == 0 {
		frames = data.Frames{data.NewFrame(name)}
	}
	if frames[0].Meta == nil {
		frames[0].Meta = &data.FrameMeta{}
	}
	frames[0].AppendNotices(data.Notice{Severity: data.NoticeSeverityInfo, Text: notice})
	return frames
}
