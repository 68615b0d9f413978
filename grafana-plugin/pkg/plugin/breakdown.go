package plugin

import (
	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

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
