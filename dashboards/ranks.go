package dashboards

import (
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/barchart"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/trend"

	"github.com/deepseed/deepseed/alerts"
	"github.com/deepseed/deepseed/api"
)

func ranks() (dashboard.Dashboard, []Annotation, error) {
	b := newDashboard(UIDRanks, "DeepSeed · Ranks",
		"Every rank of one run: step time, stragglers, GPU utilisation and memory.",
		"ranks").
		WithVariable(projectVar()).
		WithVariable(runVar(false))
	b = windowVars(b).
		Link(runLink("Training run", UIDTrainingRun)).
		Link(runLink("GPUs of this run", UIDGPUNodes))

	y := uint32(0)
	b = b.WithRow(row("Stragglers", y))
	y++
	b = b.WithPanel(rankTable(gridPos(0, y, 24, 9)))
	y += 9
	b = b.WithPanel(rankBars("Busy time per rank", "busy_ms", "Busy", "ms", gridPos(0, y, 8, 8)))
	b = b.WithPanel(rankBars("Wait in the collective per rank", "sync_wait_ms", "Wait in collective", "ms", gridPos(8, y, 8, 8)))
	b = b.WithPanel(rankBars("Lateness at the synchronisation point", "lateness_ms", "Lateness", "ms", gridPos(16, y, 8, 8)))
	y += 8
	b = b.WithPanel(rankBars("Median step time per rank", "median_step_ms", "Median step", "ms", gridPos(0, y, 12, 8)))
	b = b.WithPanel(rankBars("Wait on slower ranks", "wait_ms", "Waiting on others", "ms", gridPos(12, y, 12, 8)))
	y += 8

	b = b.WithRow(row("Per rank by step", y))
	y++
	b = b.WithPanel(stragglerScoreChart(gridPos(0, y, 12, 9)))
	b = b.WithPanel(stepChart("Lateness per rank",
		"How long after the first rank each rank reached the end of its backward, by step, host clocks corrected by the offsets in the Ranks table. A straggler's line sits above the others from the step it became slow; all lines near 0 means no rank keeps the others waiting.", "ms",
		gridPos(12, y, 12, 9), stepQuery("all", "lateness_ms")).Min(0))
	y += 9
	b = b.WithPanel(stepChart("Wait in the collective per rank",
		"How long each rank waited at the end of backward for the others, by step: every rank but the straggler waits; the straggler's line sits at the bottom.", "ms",
		gridPos(0, y, 12, 9), stepQuery("all", "sync_wait_ms")).Min(0))
	b = b.WithPanel(stepChart("Step time per rank", "Step time of every rank by step. Under synchronous training every rank's step time is equal; lateness and waits name the straggler.", "ms",
		gridPos(12, y, 12, 9), stepQuery("all", "step_ms")).Min(0))
	y += 9
	b = b.WithPanel(stepChart("Communication time per rank", "Time in collectives not overlapped with compute, by step.", "ms",
		gridPos(0, y, 12, 9), stepQuery("all", "comm_ms")).Min(0))
	b = b.WithPanel(stepChart("Data loading time per rank", "Time waiting for the next batch, by step.", "ms",
		gridPos(12, y, 12, 9), stepQuery("all", "data_ms")).Min(0))
	y += 9

	// GPU samples are taken by time: these keep a time axis fitted to the
	// run, each point's step in the tooltip.
	b = b.WithRow(row("GPUs per rank (over time)", y))
	y++
	b = b.WithPanel(runTimeSeries("GPU utilisation per rank", "Utilisation of each rank's GPU over the run's time; the tooltip gives each point's step.", "percent",
		gridPos(0, y, 12, 9), stepSeries("all", "gpu_util_pct")).Min(0).Max(100))
	b = b.WithPanel(runTimeSeries("GPU memory per rank", "GPU memory in use on each rank over the run's time; the tooltip gives each point's step.", "decgbytes",
		gridPos(12, y, 12, 9), stepSeries("all", "gpu_mem_used_gb")).Min(0))
	y += 9

	b = b.WithRow(row("Alerts", y))
	y++
	b = b.WithPanel(dataTable("Open alerts",
		"The server's detectors' open alerts on this run: non-finite loss, overflow storm, loss spike, idle GPU, stalled run or rank, data stall, straggler.",
		gridPos(0, y, 24, 7), runQuery(api.QueryAlerts)))

	d, err := b.Build()
	if err != nil {
		return d, nil, err
	}
	return d, runEvents(), nil
}

// ranksQuery asks for the per-rank table of $run; the straggler margin is
// the server's (serve --straggler-pct).
func ranksQuery() api.PluginQuery { return runQuery(api.QueryRanks) }

func rankTable(pos dashboard.GridPos) *table.PanelBuilder {
	return dataTable("Ranks",
		"Steady-state timing of each rank. Busy: step time less the wait in the end-of-backward collective. Lateness: arrival there after the first rank (medians). Straggler: median lateness above the margin (a share of the median busy time); without recorded arrivals, median step time above the run's median by the margin.",
		pos, ranksQuery()).
		OverrideByRegexp(fieldRegexp("straggler"), []dashboard.DynamicConfigValue{
			prop("custom.cellOptions", map[string]any{"type": "color-background"}),
			prop("mappings", []any{map[string]any{"type": "value", "options": map[string]any{
				"true":  map[string]any{"text": "straggler", "color": "red", "index": 0},
				"false": map[string]any{"text": "ok", "color": "green", "index": 1},
			}}}),
		})
}

// rankBars is one figure of the ranks frame per rank.
func rankBars(title, field, display, unit string, pos dashboard.GridPos) *barchart.PanelBuilder {
	return barchart.NewPanelBuilder().
		Title(title).
		Datasource(DatasourceRef()).
		GridPos(pos).
		WithTarget(target("A", ranksQuery())).
		WithTransformation(dashboard.DataTransformerConfig{
			Id:      "filterFieldsByName",
			Options: map[string]any{"include": map[string]any{"pattern": fieldRegexp("rank_name", "Rank name", field, display)}},
		}).
		// Bars are labelled with the rank's name ("rank 3"), a string
		// field of the ranks frame.
		XField("Rank name").
		XTickLabelRotation(0).
		ShowValue(common.VisibilityModeAlways).
		Stacking(common.StackingModeNone).
		Unit(unit).
		Min(0).
		FillOpacity(80).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(false).DisplayMode(common.LegendDisplayModeHidden).Placement(common.LegendPlacementBottom).Calcs([]string{}))
}

// stragglerScoreChart is each rank's straggler score by step, with the
// straggler alert's default threshold (alerts.Defaults) as a dashed line:
// where a rank's line crosses it is when the alert opened.
func stragglerScoreChart(pos dashboard.GridPos) *trend.PanelBuilder {
	limit := alerts.Defaults().StragglerPct / 100
	return stepChart("Straggler score per rank",
		fmt.Sprintf("Each rank's straggler score by step: an EWMA of its lateness as a share of the ranks' median busy time. The rank whose line rises is the straggler, from the step where it leaves 0; the straggler alert fires while a score is above the dashed line (%g %%, the default straggler_pct; a run's own setting may differ). Scores are stored by the alert evaluator, so a run it has not scored shows none.", limit*100),
		"percentunit", pos, stepQuery("all", "straggler_score")).
		Min(0).
		Thresholds(dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps([]dashboard.Threshold{
			{Value: nil, Color: "green"},
			{Value: &limit, Color: "red"},
		})).
		ThresholdsStyle(common.NewGraphThresholdsStyleConfigBuilder().Mode(common.GraphThresholdsStyleModeDashed))
}
