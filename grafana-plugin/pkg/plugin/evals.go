package plugin

import (
	"maps"
	"slices"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// evalsQuery is a run's evaluations, from GET /runs/{id}/evals.
var evalsQuery = get[api.EvalsResponse]{
	path:   runPathOf("evals"),
	frames: func(r request, e api.EvalsResponse) data.Frames { return evalsFrames(r.PluginQuery, e) },
}

// evalsFrames gives one frame per split (val, test, …): the points to
// overlay on the loss chart, with the training loss at each.
func evalsFrames(q api.PluginQuery, r api.EvalsResponse) data.Frames {
	var splits []string
	bySplit := map[string][]api.EvalPoint{}
	for _, e := range r.Evals {
		if _, ok := bySplit[e.Split]; !ok {
			splits = append(splits, e.Split)
		}
		bySplit[e.Split] = append(bySplit[e.Split], e)
	}
	frames := make(data.Frames, 0, len(splits))
	for _, split := range splits {
		pts := bySplit[split]
		labels := data.Labels{"split": split}
		var fields []*data.Field
		if q.XAxis == "step" {
			fields = append(fields, intCol(pts, "step", "Step", func(e api.EvalPoint) *int64 { return i64(e.Step) }))
		} else {
			t := make([]time.Time, len(pts))
			for i, e := range pts {
				t[i] = e.Time
			}
			fields = append(fields, data.NewField("time", nil, t),
				intCol(pts, "step", "Step", func(e api.EvalPoint) *int64 { return i64(e.Step) }))
		}
		labeled := func(f *data.Field) *data.Field { f.Labels = labels; return f }
		fields = append(fields,
			labeled(numCol(pts, "loss", "none", split+" loss", func(e api.EvalPoint) *float64 { return fp(e.Loss) })),
			labeled(numCol(pts, "accuracy", "percentunit", split+" accuracy", func(e api.EvalPoint) *float64 { return fp(e.Accuracy) })),
			labeled(numCol(pts, "f1", "percentunit", split+" F1", func(e api.EvalPoint) *float64 { return fp(e.F1) })),
			labeled(numCol(pts, "train_loss", "none", "train loss at "+split, func(e api.EvalPoint) *float64 { return fp(e.TrainLoss) })),
		)
		names := map[string]bool{}
		for _, e := range pts {
			for k := range e.Metrics {
				names[k] = true
			}
		}
		// An evaluation's other figures (an HF Trainer's epoch, runtime,
		// samples per second) are in the tooltip, not drawn: on the loss
		// chart they would land on the loss's or the accuracy's axis.
		for _, k := range slices.Sorted(maps.Keys(names)) {
			f := labeled(numCol(pts, "metrics."+k, "none", split+" "+k, func(e api.EvalPoint) *float64 {
				if v, ok := e.Metrics[k]; ok {
					return fv(v)
				}
				return nil
			}))
			f.Config.Custom = map[string]any{"hideFrom": map[string]any{"viz": true, "legend": true, "tooltip": false}}
			fields = append(fields, f)
		}
		f := data.NewFrame(split, fields...)
		f.Meta = &data.FrameMeta{}
		frames = append(frames, f)
	}
	return frames
}
