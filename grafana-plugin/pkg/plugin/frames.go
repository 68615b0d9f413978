package plugin

import (
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// This file holds what the frame builders of the query types share. A
// frame builder computes nothing: values pass through as the server sent
// them, with units and display names attached. The heatmap's colour range
// is the one exception (heatmap.go).

// Column helpers build one field from a slice of rows.

func strCol[T any](rows []T, name, display string, get func(T) string) *data.Field {
	v := make([]string, len(rows))
	for i, r := range rows {
		v[i] = get(r)
	}
	return withConfig(data.NewField(name, nil, v), "", display)
}

func numCol[T any](rows []T, name, unit, display string, get func(T) *float64) *data.Field {
	v := make([]*float64, len(rows))
	for i, r := range rows {
		v[i] = get(r)
	}
	return withConfig(data.NewField(name, nil, v), unit, display)
}

func intCol[T any](rows []T, name, display string, get func(T) *int64) *data.Field {
	v := make([]*int64, len(rows))
	for i, r := range rows {
		v[i] = get(r)
	}
	return withConfig(data.NewField(name, nil, v), "none", display)
}

func timeCol[T any](rows []T, name, display string, get func(T) *time.Time) *data.Field {
	v := make([]*time.Time, len(rows))
	for i, r := range rows {
		v[i] = get(r)
	}
	return withConfig(data.NewField(name, nil, v), "", display)
}

func boolCol[T any](rows []T, name, display string, get func(T) bool) *data.Field {
	v := make([]bool, len(rows))
	for i, r := range rows {
		v[i] = get(r)
	}
	return withConfig(data.NewField(name, nil, v), "", display)
}

func withConfig(f *data.Field, unit, display string) *data.Field {
	if unit == "" && display == "" {
		return f
	}
	return f.SetConfig(&data.FieldConfig{Unit: unit, DisplayNameFromDS: display})
}

func fp(f *api.Float) *float64 {
	if f == nil {
		return nil
	}
	v := float64(*f)
	return &v
}

func fv(f api.Float) *float64 { v := float64(f); return &v }

func ip(i *int) *int64 {
	if i == nil {
		return nil
	}
	v := int64(*i)
	return &v
}

func i64(i int64) *int64 { return &i }

// timeSeriesMeta marks a frame of the data plane's multi-frame time series
// format, which alerting and recorded queries read.
func timeSeriesMeta() *data.FrameMeta {
	return &data.FrameMeta{Type: data.FrameTypeTimeSeriesMulti, TypeVersion: data.FrameTypeVersion{0, 1}}
}
