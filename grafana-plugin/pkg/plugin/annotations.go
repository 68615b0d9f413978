package plugin

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// annotationsQuery is run events for annotations, from GET /annotations:
// a run's whole, or those of the dashboard's range.
var annotationsQuery = get[api.AnnotationsResponse]{
	path: pathOf("/api/v1/annotations"),
	params: func(r request) params {
		p := params{}
		p.set("run_id", r.RunID)
		// One annotation per event type (checkpoints, overflow skips, …)
		// lets a dashboard give each its own colour and toggle.
		p.add("type", splitList(r.EventTypes))
		// A run's events are wanted whole: its panels show the run's own
		// window (see window.go), which the dashboard's range may not cover.
		if r.RunID == "" {
			p.timeRange(r.timeRange)
		}
		return p
	},
	frames: func(_ request, a api.AnnotationsResponse) data.Frames { return data.Frames{annotationsFrame(a)} },
}

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
		strCol(rows, "text", "", annotationText),
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

// annotationText is what an annotation's tooltip says: for a hang report
// the server's sentence (who stopped first, where, the last collective)
// rather than the report's JSON, whose stacks the Hang reports table
// shows; for the collector's GPU snapshot beside it, a line per GPU.
func annotationText(a api.Annotation) string {
	switch a.Type {
	case api.EventHang:
		if a.Summary != "" {
			return a.Summary
		}
		var h hangReport
		if json.Unmarshal([]byte(a.Text), &h) == nil && h.Rank != nil {
			return fmt.Sprintf("rank %d reported a hang (%s); its stacks are in the Hang reports table", *h.Rank, lastCollective(h))
		}
	case api.EventHangGPUs:
		var g hangGPUs
		if json.Unmarshal([]byte(a.Text), &g) == nil && g.Host != "" {
			return "GPUs of " + g.Host + " at the hang: " + gpuSummary(g)
		}
	}
	return a.Text
}
