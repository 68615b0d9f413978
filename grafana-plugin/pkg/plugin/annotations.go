package plugin

import (
	"sort"
	"strings"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// annotationsFrame has the fields Grafana's annotation support maps by
// name: time, title, text and tags (comma-separated).
func annotationsFrame(r api.AnnotationsResponse) *data.Frame {
	rows := r.Annotations
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Time.Before(rows[j].Time) })
	t := make([]time.Time, len(rows))
	for i, a := range rows {
		t[i] = a.Time
	}
	return data.NewFrame("annotations",
		data.NewField("time", nil, t),
		strCol(rows, "title", "", func(a api.Annotation) string { return a.Title }),
		strCol(rows, "text", "", func(a api.Annotation) string { return a.Text }),
		strCol(rows, "tags", "", func(a api.Annotation) string {
			tags := a.Tags
			if len(tags) == 0 && a.Type != "" {
				tags = []string{a.Type}
			}
			return strings.Join(tags, ",")
		}),
		strCol(rows, "type", "", func(a api.Annotation) string { return a.Type }),
		strCol(rows, "run_id", "", func(a api.Annotation) string { return a.RunID }),
		intCol(rows, "step", "", func(a api.Annotation) *int64 { return a.Step }),
	)
}
