package plugin

import (
	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// consistencyQuery is the invariants a run's records break, from the
// consistency list of GET /runs/{id} (docs/metrics.md): one row each, its
// sentence first.
var consistencyQuery = get[api.RunDetail]{
	path:   runPathOf(""),
	frames: func(_ request, rd api.RunDetail) data.Frames { return data.Frames{consistencyFrame(rd.Consistency)} },
}

// checkNames are the invariants in words.
var checkNames = map[string]string{
	api.CheckMFURange:      "MFU within (0, 1]",
	api.CheckPhases:        "Phases within the step",
	api.CheckOptimizerStep: "Steps are optimizer steps",
	api.CheckPrecision:     "Precision as declared",
}

// consistencyFrame is a row per broken invariant; none gives no fields, so
// that Grafana shows the panel's no-value text (ConsistentText) rather
// than empty columns, with a notice saying it too.
func consistencyFrame(checks []api.ConsistencyCheck) *data.Frame {
	if len(checks) == 0 {
		f := data.NewFrame("consistency")
		f.AppendNotices(data.Notice{Severity: data.NoticeSeverityInfo, Text: api.ConsistentText})
		return f
	}
	return data.NewFrame("consistency",
		strCol(checks, "text", "What it means", func(c api.ConsistencyCheck) string { return c.Text }),
		strCol(checks, "check", "Check", func(c api.ConsistencyCheck) string {
			if n, ok := checkNames[c.Check]; ok {
				return n
			}
			return c.Check
		}),
		strCol(checks, "seen", "Seen", func(c api.ConsistencyCheck) string { return c.Seen }),
		intCol(checks, "steps", "Steps", func(c api.ConsistencyCheck) *int64 { return &c.Steps }),
	)
}
