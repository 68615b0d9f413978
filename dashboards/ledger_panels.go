package dashboards

import (
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/table"

	"github.com/deepseed/deepseed/api"
)

// The panels of regressions and the ledger of lost GPU-hours
// (docs/regression.md): What changed on the Training run dashboard, Lost
// GPU-hours by cause on Compare (a column per run compared) and on Jobs (a
// column per day of the project's runs).

// whatChanged adds the What changed panel at y and returns the next free
// row: the server's sentence on the run against its comparable runs, and,
// one click away in the table's frame picker, the figures, where the
// change is and what differs.
func whatChanged(b *dashboard.DashboardBuilder, y uint32) (*dashboard.DashboardBuilder, uint32) {
	wrap := prop("custom.cellOptions", map[string]any{"type": "auto", "wrapText": true})
	b = b.WithPanel(dataTable("What changed",
		"The run against the comparable runs of its project (same model, parameters, world size, precision, parallelism and micro batch; the 8 newest started before it): the change in step time, throughput, MFU and peak memory when beyond the baseline runs' own spread, where it is (phase, layers, ranks and their hosts) and what differs (git commit and diff, config keys, library versions, hosts, GPU clocks and throttling). Pick "+
			"\""+api.RegressionFiguresFrame+"\", \""+api.RegressionPlacesFrame+"\" or \""+api.RegressionDiffersFrame+"\" below the table for the details.",
		gridPos(0, y, 24, 5), runQuery(api.QueryRegression)).
		FrameIndex(0).
		Filterable(false).
		OverrideByName("What changed", []dashboard.DynamicConfigValue{wrap, prop("custom.width", 600)}).
		OverrideByName("Likely cause", []dashboard.DynamicConfigValue{prop("custom.width", 110)}).
		OverrideByName("Baseline runs", []dashboard.DynamicConfigValue{wrap}).
		OverrideByName("Δ", []dashboard.DynamicConfigValue{prop("decimals", 1)}).
		OverrideByName("Threshold", []dashboard.DynamicConfigValue{prop("decimals", 1)}))
	return b, y + 5
}

// lostGPUHours is a table of the ledger query q: a row per cause with how
// it was computed, a column of GPU-hours per run or day, each cell a bar
// against the column's largest value, the run's (or day's) GPU-hours.
func lostGPUHours(description string, pos dashboard.GridPos, q api.PluginQuery) *table.PanelBuilder {
	return dataTable("Lost GPU-hours by cause", description, pos, q).
		Filterable(false).
		// The causes first, the frame's order kept for the rest: one
		// column per run or day, how it was computed last.
		WithTransformation(dashboard.DataTransformerConfig{
			Id:      "organize",
			Options: map[string]any{"indexByName": map[string]any{"Cause": 0}, "excludeByName": map[string]any{}, "renameByName": map[string]any{}},
		}).
		OverrideByFieldType("number", []dashboard.DynamicConfigValue{
			prop("custom.cellOptions", map[string]any{"type": "gauge", "mode": "basic", "valueDisplayMode": "text"}),
			prop("min", 0),
			prop("decimals", 2),
			prop("custom.width", 120),
		}).
		OverrideByName("Cause", []dashboard.DynamicConfigValue{prop("custom.width", 210)}).
		OverrideByName("How it was computed", []dashboard.DynamicConfigValue{prop("custom.inspect", true), prop("custom.width", 360)})
}

// ledgerHow is what the descriptions of both ledger panels say.
const ledgerHow = "Each cause takes at most what the causes before it left of the GPU-hours (ranks × wall time from the first step to the last), so together they never pass them; each row says how the server computed it (open a cell to read it whole), and each bar is a share of the column's GPU-hours."

// compareLedger adds the selected runs' Lost GPU-hours panel at y and
// returns the next free row.
func compareLedger(b *dashboard.DashboardBuilder, y uint32, runIDs []string) (*dashboard.DashboardBuilder, uint32) {
	q := api.PluginQuery{QueryType: api.QueryLedger, RunIDs: runIDs}
	return b.WithPanel(lostGPUHours("GPU-hours each run compared lost: to restarts, stalls and hangs, idle GPUs, skipped steps, stragglers (by data, host, GPU, communication), throttling and a regression against its baseline runs. "+ledgerHow,
		gridPos(0, y, 24, 10), q)), y + 10
}

// jobsLedger adds the project's Lost GPU-hours panel at y and returns the
// next free row.
func jobsLedger(b *dashboard.DashboardBuilder, y uint32) (*dashboard.DashboardBuilder, uint32) {
	q := api.PluginQuery{QueryType: api.QueryLedger, Project: "$" + varProject}
	return b.WithPanel(lostGPUHours("GPU-hours the project's newest 50 runs (every project's for All) lost, by cause: all of them, then each day of the runs' start (a day's causes only; its lost line is their sum). "+ledgerHow,
		gridPos(0, y, 24, 10), q)), y + 10
}
