package dashboards

import (
	"github.com/grafana/grafana-foundation-sdk/go/barchart"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"

	"github.com/deepseed/deepseed/api"
)

// figure is one steady-state figure of the compare frame (the JSON names
// of [api.CompareRow]) shown as a bar chart, as in the experiment report.
// display is the column's display name in the plugin's compare frame.
type figure struct{ title, field, display, unit string }

var compareFigures = []figure{
	{"GPU memory peak", "gpu_mem_peak_mb", "GPU mem peak", "decmbytes"},
	{"GPU utilisation", "gpu_util_pct", "GPU util", "percent"},
	{"CPU utilisation", "cpu_util_pct", "CPU util", "percent"},
	{"Step time", "step_time_s", "Step time", "s"},
	{"Speed", "steps_per_s", "Steps/s", "suffix: steps/s"},
	{"Samples per second", "samples_per_s", "Samples/s", "suffix: samples/s"},
}

func compareQuery(runIDs []string, sweep string) api.PluginQuery {
	return api.PluginQuery{
		QueryType: api.QueryCompare,
		Project:   "$" + varProject,
		RunIDs:    runIDs,
		Sweep:     sweep,
		Baseline:  "$" + varBaseline,
	}
}

// compareBars is a bar chart of one figure per run, runs named on x.
func compareBars(f figure, pos dashboard.GridPos, q api.PluginQuery) *barchart.PanelBuilder {
	return barchart.NewPanelBuilder().
		Title(f.title).
		Datasource(DatasourceRef()).
		GridPos(pos).
		WithTarget(target("A", q)).
		// Keep the run name and the one figure: the compare frame holds
		// every configuration and figure column.
		WithTransformation(dashboard.DataTransformerConfig{
			Id:      "filterFieldsByName",
			Options: map[string]any{"include": map[string]any{"pattern": fieldRegexp("name", "Run", f.field, f.display)}},
		}).
		XField("Run").
		Orientation(common.VizOrientationAuto).
		ShowValue(common.VisibilityModeAlways).
		Stacking(common.StackingModeNone).
		XTickLabelRotation(-30).
		Unit(f.unit).
		Min(0).
		FillOpacity(80).
		ColorScheme(dashboard.NewFieldColorBuilder().Mode(dashboard.FieldColorModeIdPaletteClassic)).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(false).DisplayMode(common.LegendDisplayModeHidden).Placement(common.LegendPlacementBottom).Calcs([]string{}))
}

// compareSection is a comparison table with its bar charts.
func compareSection(b *dashboard.DashboardBuilder, y uint32, q api.PluginQuery) (*dashboard.DashboardBuilder, uint32) {
	b = b.WithPanel(dataTable("Comparison",
		"Configuration and steady-state figures of each run, as in the experiment report; with a baseline, the change of each figure against it in percent.",
		gridPos(0, y, 24, 9), q))
	y += 9
	for i, f := range compareFigures {
		b = b.WithPanel(compareBars(f, gridPos(uint32(i%3)*8, y+uint32(i/3)*8, 8, 8), q))
	}
	return b, y + uint32((len(compareFigures)+2)/3)*8
}

func compare() (dashboard.Dashboard, []Annotation, error) {
	b := newDashboard(UIDCompare, "DeepSeed · Compare runs",
		"Runs side by side: ZeRO stages, precision, pipeline vs data parallel, offload, larger models. Pick runs (or a sweep) and a baseline; each sweep gets its own section.",
		"compare").
		WithVariable(projectVar()).
		WithVariable(queryVar(varSweep, "Sweep", api.VariableQuery{Resource: api.VariableSweeps, Project: "$" + varProject}).
			Multi(true).IncludeAll(true)).
		WithVariable(runVar(true)).
		WithVariable(queryVar(varBaseline, "Baseline", api.VariableQuery{Resource: api.VariableRuns, Project: "$" + varProject}).
			Description("Run the others are compared against; figures show their change in percent."))

	y := uint32(0)
	b = b.WithRow(row("Selected runs", y))
	y++
	b, y = compareSection(b, y, compareQuery([]string{"$" + varRun}, ""))

	// One section per sweep: the experiment report's questions (ZeRO
	// stages, precision, parallelism, offload, larger model) are sweeps.
	b = b.WithRow(row("Sweep $sweep", y).Repeat(varSweep))
	y++
	b, _ = compareSection(b, y, compareQuery(nil, "$"+varSweep))

	d, err := b.Build()
	return d, nil, err
}
