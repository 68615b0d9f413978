package dashboards

import (
	"cmp"

	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
	"github.com/grafana/grafana-foundation-sdk/go/trend"

	"github.com/deepseed/deepseed/api"
)

// runQuery is a query about the run chosen in $run.
func runQuery(queryType string) api.PluginQuery {
	return api.PluginQuery{QueryType: queryType, RunID: "$" + varRun}
}

// seriesQuery asks for step metrics of $run on a time axis.
func seriesQuery(rank string, metrics ...string) api.PluginQuery {
	q := runQuery(api.QuerySeries)
	q.Metrics = metrics
	q.Rank = rank
	return q
}

// stepSeries is a seriesQuery whose frames also carry each point's step,
// shown in the tooltip: a training chart on a time axis read by step.
func stepSeries(rank string, metrics ...string) api.PluginQuery {
	q := seriesQuery(rank, metrics...)
	q.WithStep = true
	return q
}

// rankGPUQuery asks for the NVML samples of the GPU the collector
// attributed to one rank of $run.
func rankGPUQuery(rank string, metrics ...string) api.PluginQuery {
	return api.PluginQuery{QueryType: api.QueryGPUs, RunID: "$" + varRun, Rank: rank, Metrics: metrics}
}

// stepQuery asks for step metrics of $run with the step as x: the whole
// run, whatever the time picker says.
func stepQuery(rank string, metrics ...string) api.PluginQuery {
	q := seriesQuery(rank, metrics...)
	q.XAxis = "step"
	return q
}

// StepField is the x field of every step chart, as the plugin labels it.
const StepField = "Step"

// stepChart is a training chart read by step, as in the seed: Grafana's
// Trend panel (a time series panel whose x is a number), the plugin's
// frames joined on their step so the panel gets the one frame it draws.
// Steps missing from one metric are bridged, not gaps.
func stepChart(title, description, unit string, pos dashboard.GridPos, queries ...api.PluginQuery) *trend.PanelBuilder {
	p := trend.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(DatasourceRef()).
		GridPos(pos).
		Unit(unit).
		XField(StepField).
		WithTransformation(dashboard.DataTransformerConfig{
			Id:      "joinByField",
			Options: map[string]any{"byField": StepField, "mode": "outer"},
		}).
		LineWidth(1).
		FillOpacity(8).
		SpanNulls(common.BoolOrFloat64{Bool: ptr(true)}).
		ShowPoints(common.VisibilityModeNever).
		Legend(common.NewVizLegendOptionsBuilder().
			ShowLegend(true).
			DisplayMode(common.LegendDisplayModeList).
			Placement(common.LegendPlacementBottom).
			Calcs([]string{})).
		Tooltip(common.NewVizTooltipOptionsBuilder().
			Mode(common.TooltipDisplayModeMulti).
			Sort(common.SortOrderNone)).
		// The step axis stays linear where the values' axis is not (a
		// log scale in the defaults applies to the x field too).
		OverrideByName(StepField, []dashboard.DynamicConfigValue{prop("custom.axisLabel", StepField), prop("unit", "none"),
			prop("custom.scaleDistribution", map[string]any{"type": "linear"})})
	for i, q := range queries {
		p = p.WithTarget(target(refID(i), q))
	}
	return p
}

// runTimeSeries is a timeSeries of a run-scoped dashboard: its time range
// is $run's window (see RunSpan), not the dashboard's relative range.
func runTimeSeries(title, description, unit string, pos dashboard.GridPos, queries ...api.PluginQuery) *timeseries.PanelBuilder {
	return timeSeries(title, description, unit, pos, queries...).
		TimeFrom(RunSpan).
		TimeShift(RunShift).
		HideTimeOverride(true)
}

// card is one summary card: a stat of one field of the run_summary frame,
// found by its field name or by its display name, which is the card's
// title unless display says otherwise.
type card struct {
	title, field, unit string
	decimals           float64
	description        string
	display            string
	// noValue is what the card says when the run has no such figure: why,
	// in one line ("not measured by this run: …"); "–" when empty.
	noValue string
}

func statCard(c card, pos dashboard.GridPos, q api.PluginQuery) *stat.PanelBuilder {
	p := stat.NewPanelBuilder().
		Title(c.title).
		Description(c.description).
		Datasource(DatasourceRef()).
		GridPos(pos).
		WithTarget(target("A", q)).
		// The frame is one row: "last" shows its value as it is, a NaN
		// loss as NaN ("lastNotNull" would skip it and show nothing).
		ReduceOptions(common.NewReduceDataOptionsBuilder().
			Values(false).
			Calcs([]string{"last"}).
			Fields(fieldRegexp(c.field, cmp.Or(c.display, c.title)))).
		ColorMode(common.BigValueColorModeNone).
		GraphMode(common.BigValueGraphModeNone).
		TextMode(common.BigValueTextModeValue).
		JustifyMode(common.BigValueJustifyModeCenter).
		NoValue(cmp.Or(c.noValue, "–"))
	if c.unit != "" {
		p = p.Unit(c.unit)
	}
	if c.decimals >= 0 {
		p = p.Decimals(c.decimals)
	}
	return p
}

// timeSeries is a line chart of plugin queries with Grafana's usual
// defaults for training curves.
func timeSeries(title, description, unit string, pos dashboard.GridPos, queries ...api.PluginQuery) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(DatasourceRef()).
		GridPos(pos).
		Unit(unit).
		LineWidth(1).
		FillOpacity(8).
		SpanNulls(common.BoolOrFloat64{Bool: ptr(false)}).
		ShowPoints(common.VisibilityModeNever).
		Legend(common.NewVizLegendOptionsBuilder().
			ShowLegend(true).
			DisplayMode(common.LegendDisplayModeList).
			Placement(common.LegendPlacementBottom).
			Calcs([]string{})).
		Tooltip(common.NewVizTooltipOptionsBuilder().
			Mode(common.TooltipDisplayModeMulti).
			Sort(common.SortOrderNone))
	for i, q := range queries {
		p = p.WithTarget(target(refID(i), q))
	}
	return p
}

// tableMinWidthPx is the least width of a table column that sets none:
// Grafana's own default (150 px) put the right-hand columns of most tables
// off-screen in a 1,600-px window; narrower, every column shows, a long
// value ends in an ellipsis (its cell shows it whole on hover) and a long
// header wraps onto a second line.
const tableMinWidthPx = 64

// noCellValue is what a table cell without a value (null, NaN or an empty
// string) reads. Without it Grafana writes the panel's no-data sentence
// into every such cell, cut to the column's width.
const noCellValue = "–"

// dataTable is a table panel of plugin queries.
func dataTable(title, description string, pos dashboard.GridPos, queries ...api.PluginQuery) *table.PanelBuilder {
	p := table.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(DatasourceRef()).
		GridPos(pos).
		ShowHeader(true).
		CellHeight(common.TableCellHeightSm).
		MinWidth(tableMinWidthPx).
		Mappings([]dashboard.ValueMapping{noCell(dashboard.SpecialValueMatchNullAndNan, 0),
			noCell(dashboard.SpecialValueMatchEmpty, 1)}).
		OverrideByRegexp("/.*/", []dashboard.DynamicConfigValue{prop("custom.wrapHeaderText", true)}).
		Filterable(true).
		// Numbers sort; a filter's list of their values helps nobody, and
		// its icon would take a narrow column's header.
		WithOverride(dashboard.MatcherConfig{Id: "byType", Options: "number"}, []dashboard.DynamicConfigValue{prop("custom.filterable", false)})
	for i, q := range queries {
		p = p.WithTarget(target(refID(i), q))
	}
	return p
}

// noCell maps a table cell's special value (null and NaN, or an empty
// string) to noCellValue, in the text's colour: a coloured column (Δ
// against a baseline) would otherwise paint it as a loss or a gain.
func noCell(match dashboard.SpecialValueMatch, index int32) dashboard.ValueMapping {
	return dashboard.ValueMapping{SpecialValueMap: &dashboard.SpecialValueMap{
		Type: dashboard.MappingTypeSpecialValue,
		Options: dashboard.DashboardSpecialValueMapOptions{Match: match,
			Result: dashboard.ValueMappingResult{Text: ptr(noCellValue), Color: ptr("text"), Index: ptr(index)}},
	}}
}

func refID(i int) string { return string(rune('A' + i)) }

// prop is one field override property.
func prop(id string, value any) dashboard.DynamicConfigValue {
	return dashboard.DynamicConfigValue{Id: id, Value: value}
}

// rightAxis moves matching fields to a right-hand axis of their own.
func rightAxis(unit string, extra ...dashboard.DynamicConfigValue) []dashboard.DynamicConfigValue {
	return append([]dashboard.DynamicConfigValue{
		prop("custom.axisPlacement", "right"),
		prop("unit", unit),
	}, extra...)
}

// pointsOnly draws matching fields as dots, like the seed's evaluation
// markers on the loss chart.
func pointsOnly(size int) []dashboard.DynamicConfigValue {
	return []dashboard.DynamicConfigValue{
		prop("custom.drawStyle", "points"),
		prop("custom.showPoints", "always"),
		prop("custom.pointSize", size),
	}
}
