package plugin

import (
	"github.com/grafana/grafana-plugin-sdk-go/data"
)

// numericField is one number of a numeric-wide frame.
func numericField(name, unit string, labels data.Labels, v *float64) *data.Field {
	return data.NewField(name, labels, []*float64{v}).SetConfig(&data.FieldConfig{Unit: unit})
}

func numericFrame(name string, fields []*data.Field) *data.Frame {
	f := data.NewFrame(name, fields...)
	f.Meta = &data.FrameMeta{Type: data.FrameTypeNumericWide, TypeVersion: data.FrameTypeVersion{0, 1}}
	return f
}

func i64f(v *int64) *float64 {
	if v == nil {
		return nil
	}
	f := float64(*v)
	return &f
}
