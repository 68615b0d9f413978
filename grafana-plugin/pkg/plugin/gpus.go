package plugin

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// gpusQuery is GPU telemetry, from GET /gpus: a time series per host, GPU
// and metric, the distribution of a run's many GPUs, or, as a table, a
// row per GPU.
var gpusQuery = get[api.GPUResponse]{
	path: pathOf("/api/v1/gpus"),
	params: func(r request) params {
		p := params{}
		p.set("host", r.Host)
		// "*" is the Run picker's "All": every GPU, whoever held it.
		if r.RunID != api.AllValue {
			p.set("run_id", r.RunID)
			// A rank number picks that rank's GPU; "all" or none, every
			// GPU of the run.
			if _, err := strconv.Atoi(r.Rank); err == nil && r.RunID != "" {
				p.set("rank", r.Rank)
			}
		}
		p.add("metric", r.Metrics)
		if r.Format == api.FormatTable {
			// A row per GPU, however many the run has.
			p.set("per_gpu", "true")
		}
		p.timeRange(r.timeRange)
		p.maxPoints(r.maxDataPoints)
		return p
	},
	frames: func(q request, r api.GPUResponse) data.Frames {
		if q.GPU != "" {
			// The service filters by host and run; one GPU of a host is
			// picked here.
			keep := r.Series[:0]
			for _, s := range r.Series {
				if strconv.Itoa(s.GPU) == q.GPU {
					keep = append(keep, s)
				}
			}
			r.Series = keep
		}
		if q.Format == api.FormatTable {
			return data.Frames{gpuTableFrame(r)}
		}
		if len(r.Spread) > 0 {
			// A run of many GPUs: their distribution, drawn as the
			// ranks' band is.
			spread := spreadFrames(api.PluginQuery{XAxis: "time"}, api.SeriesResponse{Spread: r.Spread})
			return withNotice(spread, "gpus", r.Notice)
		}
		return gpuFrames(r)
	},
}

// gpuTableColumns are the columns of the per-GPU table: each metric's last
// value, and for utilisation also its mean over the range.
var gpuTableColumns = []struct {
	metric, display string
	mean            bool
}{
	{"util_pct", "Util (last)", false},
	{"util_pct", "Util (mean)", true},
	{"mem_used_bytes", "Memory used", false},
	{"mem_total_bytes", "Memory total", false},
	{"temp_c", "Temperature", false},
	{"power_w", "Power", false},
}

// gpuTableFrame is one row per host and GPU: name, the run holding it at
// the last sample, then the columns above with their units, so a table
// shows bytes as GB and power as W rather than one mixed column.
func gpuTableFrame(r api.GPUResponse) *data.Frame {
	type key struct {
		host string
		gpu  int
	}
	type gpuRow struct {
		key
		name, run string
		series    map[string][]api.TimePoint
	}
	rows := map[key]*gpuRow{}
	for _, s := range r.Series {
		k := key{s.Host, s.GPU}
		g := rows[k]
		if g == nil {
			g = &gpuRow{key: k, series: map[string][]api.TimePoint{}}
			rows[k] = g
		}
		g.name = cmp.Or(g.name, s.Name)
		g.run = cmp.Or(g.run, s.RunID)
		g.series[s.Metric] = s.Points
	}
	list := make([]*gpuRow, 0, len(rows))
	for _, g := range rows {
		list = append(list, g)
	}
	slices.SortFunc(list, func(a, b *gpuRow) int {
		return cmp.Or(cmp.Compare(a.host, b.host), cmp.Compare(a.gpu, b.gpu))
	})
	fields := []*data.Field{
		strCol(list, "host", "Host", func(g *gpuRow) string { return g.host }),
		intCol(list, "gpu", "GPU", func(g *gpuRow) *int64 { return i64(int64(g.gpu)) }),
		strCol(list, "gpu_name", "Model", func(g *gpuRow) string { return g.name }),
		strCol(list, "run_id", "Run", func(g *gpuRow) string { return g.run }),
	}
	for _, c := range gpuTableColumns {
		name := c.metric
		if c.mean {
			name += "_mean"
		}
		fields = append(fields, numCol(list, name, metricUnit(c.metric, ""), c.display, func(g *gpuRow) *float64 {
			pts := g.series[c.metric]
			if len(pts) == 0 {
				return nil
			}
			if !c.mean {
				v := float64(pts[len(pts)-1].Value)
				return &v
			}
			sum := 0.0
			for _, p := range pts {
				sum += float64(p.Value)
			}
			v := sum / float64(len(pts))
			return &v
		}))
	}
	return data.NewFrame("gpus", fields...)
}

// gpuFrames gives one time series per host, GPU and metric, labelled so
// alert rules get one instance per GPU.
func gpuFrames(r api.GPUResponse) data.Frames {
	metrics := map[string]bool{}
	for _, s := range r.Series {
		metrics[s.Metric] = true
	}
	frames := make(data.Frames, 0, len(r.Series))
	for _, s := range r.Series {
		display := fmt.Sprintf("%s GPU %d", s.Host, s.GPU)
		if len(metrics) > 1 {
			display += " " + api.MetricLabel(s.Metric)
		}
		labels := data.Labels{"host": s.Host, "gpu": strconv.Itoa(s.GPU)}
		if s.Name != "" {
			labels["gpu_name"] = s.Name
		}
		if s.RunID != "" {
			labels["run_id"] = s.RunID
		}
		t := make([]time.Time, len(s.Points))
		v := make([]float64, len(s.Points))
		for i, p := range s.Points {
			t[i], v[i] = p.Time, float64(p.Value)
		}
		f := data.NewFrame(display,
			data.NewField("time", nil, t),
			data.NewField(s.Metric, labels, v).SetConfig(&data.FieldConfig{Unit: metricUnit(s.Metric, s.Unit), DisplayNameFromDS: display}))
		f.Meta = timeSeriesMeta()
		frames = append(frames, f)
	}
	return frames
}
