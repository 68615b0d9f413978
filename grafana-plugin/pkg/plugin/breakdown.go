package plugin

import (
	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// breakdownQuery is a rank's steady-state step time by phase, from GET
// /runs/{id}/breakdown.
var breakdownQuery = get[api.Breakdown]{
	path: runPathOf("breakdown"),
	params: func(r request) params {
		p := params{}
		p.oneRank(r.Rank)
		// A breakdown runs from a step to the run's end: GET breakdown
		// takes no to_step.
		p.step("from_step", r.FromStep)
		return p
	},
	frames: func(_ request, b api.Breakdown) data.Frames { return data.Frames{breakdownFrame(b)} },
}

// breakdownFrame is one row with a field per part, which the pie chart
// draws as slices with their shares.
func breakdownFrame(b api.Breakdown) *data.Frame {
	fields := make([]*data.Field, 0, len(b.Parts))
	for _, p := range b.Parts {
		fields = append(fields, data.NewField(p.Name, nil, []float64{float64(p.MS)}).
			SetConfig(&data.FieldConfig{Unit: "ms", DisplayNameFromDS: p.Name}))
	}
	f := data.NewFrame("breakdown", fields...)
	f.Meta = &data.FrameMeta{Custom: map[string]any{
		"rank": b.Rank, "from_step": b.FromStep, "to_step": b.ToStep, "steps": b.Steps, "step_ms": fv(b.StepMS),
	}}
	return f
}
