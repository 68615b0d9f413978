package plugin

import (
	"strconv"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// alertsQuery is the open alerts, from GET /alerts: a table or, numeric,
// a field per alert for alert rules.
var alertsQuery = get[api.AlertList]{
	path: pathOf("/api/v1/alerts"),
	params: func(r request) params {
		// Open alerts only: a rule fires while one is open and resolves
		// when the server resolves it.
		p := params{"state": {"open"}, "limit": {"1000"}}
		p.set("project", r.Project)
		p.set("run_id", r.RunID)
		p.set("kind", r.AlertKind)
		return p
	},
	frames: func(r request, a api.AlertList) data.Frames {
		if r.Format == api.FormatNumeric {
			return data.Frames{alertsNumericFrame(a)}
		}
		return data.Frames{alertsFrame(a)}
	},
}

// alertsFrame is the open alerts as a table, the newest opened first.
func alertsFrame(r api.AlertList) *data.Frame {
	rows := r.Alerts
	f := data.NewFrame("alerts",
		timeCol(rows, "opened_at", "Opened", func(a api.Alert) *time.Time { return &a.OpenedAt }),
		strCol(rows, "run_id", "Run", func(a api.Alert) string { return a.RunID }),
		strCol(rows, "kind", "Kind", func(a api.Alert) string { return a.Kind }),
		strCol(rows, "subject", "Where", func(a api.Alert) string { return a.Subject }),
		intCol(rows, "step", "Step", func(a api.Alert) *int64 { return a.Step }),
		numCol(rows, "value", "none", "Value", func(a api.Alert) *float64 { return fp(a.Value) }),
		numCol(rows, "threshold", "none", "Threshold", func(a api.Alert) *float64 { return fp(a.Threshold) }),
		strCol(rows, "text", "Alert", func(a api.Alert) string { return a.Text }),
	)
	if len(rows) == 0 {
		f.AppendNotices(data.Notice{Severity: data.NoticeSeverityInfo, Text: "no open alert"})
	}
	return f
}

// alertsNumericFrame is alerts for alert rules: one number field per open
// alert, 1, labelled run_id, project, kind, subject and
// rank. A Grafana rule on it fires once per open alert and resolves when
// the server resolves the alert; no open alert is an empty frame, which a
// rule reads as no data (provision it as OK).
func alertsNumericFrame(r api.AlertList) *data.Frame {
	fields := make([]*data.Field, 0, len(r.Alerts))
	for _, a := range r.Alerts {
		labels := data.Labels{"run_id": a.RunID, "project": a.Project, "kind": a.Kind, "subject": a.Subject}
		if a.Rank != nil {
			labels["rank"] = strconv.Itoa(*a.Rank)
		}
		v := 1.0 // the detector's own value may be NaN (a non-finite loss)
		fields = append(fields, numericField("alert", "none", labels, &v))
	}
	return numericFrame("alerts", fields)
}
