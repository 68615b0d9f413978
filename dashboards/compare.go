package dashboards

import (
	"github.com/grafana/grafana-foundation-sdk/go/barchart"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/table"

	"github.com/deepseed/deepseed/api"
)

// figure is one steady-state figure of the compare frame (the JSON names
// of [api.CompareRow]) shown as a bar chart, as in the experiment report.
// display is the column's display name in the plugin's compare frame.
type figure struct{ title, field, display, unit string }

var compareFigures = []figure{
	{"GPU memory peak", "gpu_mem_peak_mb", "GPU mem peak", "decmbytes"},
	{"GPU utilisation", "gpu_util_pct", "GPU util", "percent"},
	{"CPU utilisation (host)", "cpu_util_pct", "CPU util", "percent"},
	{"Step time", "step_time_s", "Step time", "s"},
	{"Speed", "steps_per_s", "Steps/s", "suffix: steps/s"},
	{"Samples per second", "samples_per_s", "Samples/s", "suffix: samples/s"},
	{"TFLOP/s per GPU", "tflops", "TFLOP/s per GPU", "suffix: TFLOP/s"},
	{"MFU", "mfu", "MFU", "percentunit"},
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
		// Horizontal bars: each run's name on its own line, however many
		// runs (a sweep of 13 piled rotated labels on each other), and
		// values only where they fit.
		Orientation(common.VizOrientationHorizontal).
		ShowValue(common.VisibilityModeAuto).
		Stacking(common.StackingModeNone).
		// No label length: Grafana cuts a long name from the left.
		XTickLabelRotation(0).
		// Grafana sizes the names' axis by measuring them and draws them a
		// few pixels wider ("pert-large IMDB …" for "bert-large IMDB …"):
		// an axis label of one space adds the room of a label, and shows
		// nothing.
		OverrideByName("Run", []dashboard.DynamicConfigValue{prop("custom.axisLabel", " ")}).
		Unit(f.unit).
		Min(0).
		FillOpacity(80).
		ColorScheme(dashboard.NewFieldColorBuilder().Mode(dashboard.FieldColorModeIdPaletteClassic)).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(false).DisplayMode(common.LegendDisplayModeHidden).Placement(common.LegendPlacementBottom).Calcs([]string{}))
}

// compareTable is one focused table of the compare frame: the run, then
// each figure with its change against the baseline beside it, as in the
// experiment report's tables.
type compareTable struct {
	title, description string
	figures            []figure
	config             []string // display names of configuration columns
	after              []string // display names of columns after the figures
}

var compareTables = []compareTable{
	{"Configuration", "What differs between the runs: ZeRO stage, precision, parallelism, offload, batch and ranks.", nil,
		[]string{"Status", "Model", "ZeRO stage", "Precision", "Parallelism", "Pipeline stages", "Optimizer offload", "Parameter offload", "Micro batch", "World size"}, nil},
	{"Memory and utilisation", "The experiment report's columns over the steady state: GPU memory in use as NVML counts it (mean; its peak is in the bar chart below) with the torch allocator's peak beside it, GPU utilisation, and the host's CPU utilisation on the run's nodes (all of its CPUs, 0–100 %); Δ is the change against the baseline run in percent. Note: where a run too short for any sample in its steady state took the nearest readings (the run's samples outside it, host samples within 10 s, the hook's allocator peak), and which.", []figure{
		{"GPU memory mean", "gpu_mem_mean_mb", "GPU mem mean", "decmbytes"},
		{"Allocator peak", "gpu_mem_alloc_peak_mb", "Allocator peak", "decmbytes"},
		{"GPU utilisation", "gpu_util_pct", "GPU util", "percent"},
		{"CPU utilisation (host)", "cpu_util_pct", "CPU util", "percent"},
	}, nil, []string{"Note"}},
	{"Speed", "Steady-state step time and throughput; Δ against the baseline in percent.", []figure{
		{"Step time", "step_time_s", "Step time", "s"},
		{"Speed", "steps_per_s", "Steps/s", "suffix: steps/s"},
		{"Samples per second", "samples_per_s", "Samples/s", "suffix: samples/s"},
	}, nil, nil},
	{"Model FLOPs", "Steady-state model TFLOP/s per GPU and MFU (over the GPU's dense peak); Δ against the baseline in percent.", []figure{
		{"TFLOP/s per GPU", "tflops", "TFLOP/s per GPU", "suffix: TFLOP/s"},
		{"MFU", "mfu", "MFU", "percentunit"},
	}, nil, nil},
	{"Outcome", "Final training loss and best evaluation accuracy; Δ against the baseline in percent.", []figure{
		{"Final loss", "final_loss", "Final loss", "none"},
		{"Best eval accuracy", "best_eval_accuracy", "Best eval accuracy", "percentunit"},
	}, nil, nil},
}

// focusedTable keeps the run name and t's columns, each figure followed
// by its Δ column, and colours each Δ: green where the change is a gain.
func focusedTable(t compareTable, pos dashboard.GridPos, q api.PluginQuery) *table.PanelBuilder {
	names := []string{"name", "Run"}
	order := map[string]any{"Run": 0}
	for _, c := range t.config {
		names = append(names, c)
		order[c] = len(order)
	}
	for _, f := range t.figures {
		names = append(names, f.field, f.display, "delta_pct."+f.field, "Δ "+f.display)
		order[f.display] = len(order)
		order["Δ "+f.display] = len(order)
	}
	for _, c := range t.after {
		names = append(names, c)
		order[c] = len(order)
	}
	p := dataTable(t.title, t.description, pos, q).
		WithTransformation(dashboard.DataTransformerConfig{
			Id:      "filterFieldsByName",
			Options: map[string]any{"include": map[string]any{"pattern": fieldRegexp(names...)}},
		}).
		WithTransformation(dashboard.DataTransformerConfig{
			Id:      "organize",
			Options: map[string]any{"indexByName": order, "excludeByName": map[string]any{}, "renameByName": map[string]any{}},
		}).
		Filterable(false).
		// Every run compared shows, or the table pages and says so; a
		// cut-off table would hide the baseline row.
		Footer(common.NewTableFooterOptionsBuilder().Show(false).Reducer([]string{}).EnablePagination(true)).
		// A run's name whole, on two lines where it must: runs of one
		// model differ by the end of their names.
		OverrideByName("Run", []dashboard.DynamicConfigValue{prop("custom.width", 180), prop("custom.wrapText", true)}).
		OverrideByName("Model", []dashboard.DynamicConfigValue{prop("custom.width", 180), prop("custom.wrapText", true)})
	for _, f := range t.figures {
		p = p.OverrideByName("Δ "+f.display, []dashboard.DynamicConfigValue{
			prop("unit", "percent"),
			prop("decimals", 1),
			prop("custom.cellOptions", map[string]any{"type": "color-text"}),
			prop("color", map[string]any{"mode": "thresholds"}),
			prop("thresholds", deltaThresholds(f.field)),
		})
	}
	return p
}

// lowerIsBetter lists the figures whose decrease is a gain.
var lowerIsBetter = map[string]bool{"gpu_mem_peak_mb": true, "gpu_mem_mean_mb": true, "gpu_mem_alloc_peak_mb": true, "step_time_s": true, "final_loss": true}

// deltaThresholds colours a Δ % green for a gain and red for a loss.
func deltaThresholds(field string) map[string]any {
	gain, loss := "green", "red"
	if lowerIsBetter[field] {
		gain, loss = "red", "green"
	}
	return map[string]any{"mode": "absolute", "steps": []any{
		map[string]any{"color": loss, "value": nil},
		map[string]any{"color": "text", "value": -0.5},
		map[string]any{"color": gain, "value": 0.5},
	}}
}

// Heights of the compare panels, in grid rows: a table pages seven runs
// at a time (21 runs in three whole pages; nine rows showed six), and a
// bar chart gives each of 21 runs a bar of about 20 px, tall enough for
// its name (uPlot leaves out names that would overlap).
const (
	compareTableH = 10
	compareBarsH  = 13
)

// compareSection is the focused tables and the bar charts of one set of
// runs. Every table fits 1600 px: at most eleven columns.
func compareSection(b *dashboard.DashboardBuilder, y uint32, q api.PluginQuery) (*dashboard.DashboardBuilder, uint32) {
	for _, t := range compareTables {
		b = b.WithPanel(focusedTable(t, gridPos(0, y, 24, compareTableH), q))
		y += compareTableH
	}
	// A chart a row: Grafana gives a bar chart's run names at most 40 %
	// of its width and cuts the rest from the left ("raining Progress
	// (simulated)" at a third of the row); the page's width holds names
	// of about 80 characters.
	for i, f := range compareFigures {
		b = b.WithPanel(compareBars(f, gridPos(0, y+uint32(i)*compareBarsH, 24, compareBarsH), q))
	}
	return b, y + uint32(len(compareFigures))*compareBarsH
}

func compare() (dashboard.Dashboard, []Annotation, error) {
	b := newDashboard(UIDCompare, "DeepSeed · Compare runs",
		"Runs side by side: ZeRO stages, precision, pipeline vs data parallel, offload, larger models. Pick runs (or a sweep) and a baseline; each sweep gets its own section.",
		"compare").
		WithVariable(projectVar()).
		// No All: in a project without sweeps it made one section
		// "Sweep All" repeating every table; a sweep of one run is not
		// offered (nothing to compare its run with).
		WithVariable(queryVar(varSweep, "Sweep", api.VariableQuery{Resource: api.VariableSweeps, Project: "$" + varProject}).
			Multi(true)).
		WithVariable(runVar(true)).
		// The baseline opens on the first run selected
		// (api.BaselineFirst), an option of its own ahead of the runs,
		// not whichever run the list offers first: a slow outlier would
		// make every Δ read +3,000 %.
		WithVariable(queryVar(varBaseline, "Baseline", api.VariableQuery{Resource: api.VariableRuns, Project: "$" + varProject, Baseline: true}).
			Description("Run the others are compared against; figures show their change in percent. " + api.BaselineOptionText + ": the first of the runs picked.").
			Current(dashboard.VariableOption{Text: dashboard.StringOrArrayOfString{String: ptr(api.BaselineOptionText)}, Value: dashboard.StringOrArrayOfString{String: ptr(api.BaselineFirst)}}))

	y := uint32(0)
	b = b.WithRow(row("Selected runs", y))
	y++
	b, y = compareSection(b, y, compareQuery([]string{"$" + varRun}, ""))
	b, y = compareLedger(b, y, []string{"$" + varRun})

	// One section per sweep: the experiment report's questions (ZeRO
	// stages, precision, parallelism, offload, larger model) are sweeps.
	// Δ there is within the sweep, against its first trial: the
	// project's baseline is rarely one of its trials.
	b = b.WithRow(row("Sweep $sweep", y).Repeat(varSweep))
	y++
	sq := compareQuery(nil, "$"+varSweep)
	sq.Baseline = api.BaselineFirst
	b, _ = compareSection(b, y, sq)

	d, err := b.Build()
	return d, nil, err
}
