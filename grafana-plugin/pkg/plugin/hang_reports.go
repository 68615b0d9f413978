package plugin

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// Hang forensics as a table: each rank's newest hang report (the hook's
// "hang" event, whose text is JSON: reason, rank, host, step, the last
// collective and whether the GPU completed it, every thread's stack) and
// beside it the snapshot of its host's GPUs that the collector sent with
// it (the "hang_gpus" event: {"host", "gpus": [...]}).

// hangReportsQuery is the hang table, from the hang events of GET
// /annotations: the run's reports whole, whatever the dashboard's range.
var hangReportsQuery = get[api.AnnotationsResponse]{
	path: pathOf("/api/v1/annotations"),
	params: func(r request) params {
		p := params{}
		p.set("run_id", r.RunID)
		p.add("type", api.HangEventTypes)
		return p
	},
	frames: func(_ request, a api.AnnotationsResponse) data.Frames { return data.Frames{hangFrame(a)} },
}

// noHangReport is the table's notice for a run without one.
const noHangReport = "no hang reported: a rank reports one when its steps stop longer than the hook's threshold, or on SIGTERM"

// hangReport is what the table shows of the hook's report.
type hangReport struct {
	Reason         string  `json:"reason"`
	Rank           *int    `json:"rank"`
	Host           string  `json:"host"`
	Step           *int64  `json:"step"`
	StalledS       float64 `json:"stalled_s"`
	LastCollective *struct {
		Name      string `json:"name"`
		Seq       int64  `json:"seq"`
		Completed *bool  `json:"completed"`
	} `json:"last_collective"`
	Threads []struct {
		Name  string `json:"name"`
		Stack string `json:"stack"`
	} `json:"threads"`
}

// hangGPUs is what the table shows of the collector's GPU snapshot.
type hangGPUs struct {
	Host string           `json:"host"`
	GPUs []map[string]any `json:"gpus"`
}

type hangRow struct {
	at     time.Time
	rank   int
	r      hangReport
	gpus   string
	report string
}

// hangFrame is one row per rank that reported a hang, its newest report,
// the rank that stopped first (lowest step) on top.
func hangFrame(r api.AnnotationsResponse) *data.Frame {
	newest := map[int]*hangRow{}
	snaps := map[string]hangGPUs{} // by host, the newest
	snapAt := map[string]time.Time{}
	for _, a := range r.Annotations {
		switch a.Type {
		case api.EventHang:
			var h hangReport
			if json.Unmarshal([]byte(a.Text), &h) != nil || h.Rank == nil {
				continue
			}
			if old, ok := newest[*h.Rank]; ok && !a.Time.After(old.at) {
				continue
			}
			newest[*h.Rank] = &hangRow{at: a.Time, rank: *h.Rank, r: h, report: a.Text}
		case api.EventHangGPUs:
			var g hangGPUs
			if json.Unmarshal([]byte(a.Text), &g) != nil || g.Host == "" {
				continue
			}
			if a.Time.After(snapAt[g.Host]) {
				snaps[g.Host], snapAt[g.Host] = g, a.Time
			}
		}
	}
	rows := make([]*hangRow, 0, len(newest))
	for _, h := range newest {
		if g, ok := snaps[h.r.Host]; ok {
			h.gpus = gpuSummary(g)
		}
		rows = append(rows, h)
	}
	step := func(h *hangRow) int64 {
		if h.r.Step == nil {
			return -1
		}
		return *h.r.Step
	}
	slices.SortFunc(rows, func(a, b *hangRow) int { return cmp.Or(cmp.Compare(step(a), step(b)), cmp.Compare(a.rank, b.rank)) })
	if len(rows) == 0 {
		// No fields: Grafana then shows the panel's no-value sentence,
		// where a frame of empty columns draws headers only.
		f := data.NewFrame("hang_reports")
		f.AppendNotices(data.Notice{Severity: data.NoticeSeverityInfo, Text: noHangReport})
		return f
	}
	f := data.NewFrame("hang_reports",
		timeCol(rows, "time", "Reported", func(h *hangRow) *time.Time { return &h.at }),
		intCol(rows, "rank", "Rank", func(h *hangRow) *int64 { v := int64(h.rank); return &v }),
		strCol(rows, "host", "Host", func(h *hangRow) string { return h.r.Host }),
		intCol(rows, "step", "Step", func(h *hangRow) *int64 { return h.r.Step }),
		strCol(rows, "reason", "Reason", func(h *hangRow) string {
			if h.r.StalledS > 0 {
				return fmt.Sprintf("%s (no step for %.0f s)", h.r.Reason, h.r.StalledS)
			}
			return h.r.Reason
		}),
		strCol(rows, "last_collective", "Last collective", func(h *hangRow) string { return lastCollective(h.r) }),
		strCol(rows, "stack", "Stack (main thread)", func(h *hangRow) string {
			if len(h.r.Threads) == 0 {
				return ""
			}
			return strings.TrimSpace(h.r.Threads[0].Stack)
		}),
		strCol(rows, "gpus", "GPUs", func(h *hangRow) string { return h.gpus }),
		strCol(rows, "report", "Full report", func(h *hangRow) string { return h.report }),
	)
	return f
}

// lastCollective says which collective a rank entered last and whether
// its GPU completed it: a rank still inside one waits for another.
func lastCollective(h hangReport) string {
	c := h.LastCollective
	if c == nil {
		return "none recorded"
	}
	state := "completion unknown"
	if c.Completed != nil {
		state = "completed"
		if !*c.Completed {
			state = "waiting inside it"
		}
	}
	return fmt.Sprintf("%s #%d, %s", c.Name, c.Seq, state)
}

// gpuSummary is one line a GPU of the collector's snapshot: its index,
// utilisation, XID errors when there were any.
func gpuSummary(g hangGPUs) string {
	var parts []string
	for _, gpu := range g.GPUs {
		s := fmt.Sprintf("GPU %v", gpu["gpu"])
		if u, ok := gpu["util_pct"].(float64); ok {
			s += fmt.Sprintf(" %.0f %%", u)
		}
		if x, ok := gpu["xid_total"].(float64); ok && x > 0 {
			s += fmt.Sprintf(", %.0f XID", x)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}
