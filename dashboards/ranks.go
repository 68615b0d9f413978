package dashboards

import (
	"fmt"
	"regexp"

	"github.com/grafana/grafana-foundation-sdk/go/barchart"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/trend"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/detect"
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
	// Each table the page's width: side by side, half of their columns
	// were off-screen at 1,600 px.
	b = b.WithPanel(topStragglers(gridPos(0, y, 24, 8)))
	y += 8
	b = b.WithPanel(hostTable(gridPos(0, y, 24, 6)))
	y += 6
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
	b = b.WithPanel(rankStepChart("Lateness per rank",
		"How long after the first rank each rank reached the end of its backward, by step, host clocks corrected by the offsets in the Ranks table. A straggler's line sits above the others from the step it became slow; all lines near 0 means no rank keeps the others waiting.", "ms",
		gridPos(12, y, 12, 9), "lateness_ms"))
	y += 9
	b = b.WithPanel(rankStepChart("Wait in the collective per rank",
		"How long each rank waited at the end of backward for the others, by step: every rank but the straggler waits; the straggler's line sits at the bottom (on a large run, at the bottom of the band: the lines drawn are the ranks that wait most).", "ms",
		gridPos(0, y, 12, 9), "sync_wait_ms"))
	b = b.WithPanel(rankStepChart("Step time per rank", "Step time of every rank by step. Under synchronous training every rank's step time is equal; lateness and waits name the straggler.", "ms",
		gridPos(12, y, 12, 9), "step_ms"))
	y += 9
	b = b.WithPanel(rankStepChart("Communication time per rank", "Time in collectives not overlapped with compute, by step.", "ms",
		gridPos(0, y, 12, 9), "comm_ms"))
	b = b.WithPanel(rankStepChart("Data loading time per rank", "Time waiting for the next batch, by step.", "ms",
		gridPos(12, y, 12, 9), "data_ms"))
	y += 9

	// GPU samples are taken by time: these keep a time axis fitted to the
	// run, each point's step in the tooltip.
	b = b.WithRow(row("GPUs per rank (over time)", y))
	y++
	b = b.WithPanel(rankBand(runTimeSeries("GPU utilisation per rank", "Utilisation of each GPU of the run over its time, from the NVML samples the collectors attributed to the run (host GPU n), and of each rank as its steps reported it where they did. "+bandNote, "percent",
		gridPos(0, y, 12, 9), stepSeries("all", "gpu_util_pct"), rankGPUQuery("all", "util_pct")).Min(0).Max(100).NoValue(noGPUSamples), "gpu_util_pct", "util_pct"))
	b = b.WithPanel(rankBand(runTimeSeries("GPU memory per rank", "Device memory in use on each GPU of the run as NVML counts it (host GPU n), and on each rank as its steps reported it where they did. "+bandNote, "decbytes",
		gridPos(12, y, 12, 9), stepSeries("all", "gpu_mem_used_gb"), rankGPUQuery("all", "mem_used_bytes")).Min(0).NoValue(noGPUSamples), "gpu_mem_used_gb", "mem_used_bytes"))
	y += 9

	b = b.WithRow(row("Alerts", y))
	y++
	b = b.WithPanel(dataTable("Open alerts",
		"The server's detectors' open alerts on this run: non-finite loss, overflow storm, loss spike, idle GPU, stalled run or rank, data stall, straggler.",
		gridPos(0, y, 24, 7), runQuery(api.QueryAlerts)).
		NoValue("no open alert on this run"))

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
	return stragglerFlag(dataTable("Ranks",
		"Steady-state timing of each rank, the columns that name a straggler first. Busy: step time less the wait in the end-of-backward collective. Lateness: arrival there after the first rank (medians; on a long run, means over blocks of 100 steps). Straggler: median lateness above the margin (a share of the median busy time); without recorded arrivals, median step time above the run's median by the margin. A straggler's row is red.",
		pos, ranksQuery()).
		NoValue(noRankSteps).
		// The columns that tell who straggles come first and narrow, so
		// they fit a 1600-pixel screen; the rest follow.
		WithTransformation(dashboard.DataTransformerConfig{
			Id: "organize",
			Options: map[string]any{
				// Why a straggler is one is the Top stragglers table's
				// (with its delay and share of steps arrived last): with
				// those columns too, the headers were cut ("Late…").
				"excludeByName": map[string]any{"Rank name": true, "Named by": true, "Cause": true, "Own excess": true,
					"Hidden wait": true, "Delay": true, "Arrived last": true},
				"indexByName": columnOrder(rankColumns),
			},
		}).
		OverrideByRegexp(fieldRegexp("rank", "steps"), []dashboard.DynamicConfigValue{prop("custom.width", 60)}))
}

// hostWidthPx is a host column's width: host names differ at their end
// ("fleet-1024x300-node-017"), so the whole name shows.
const hostWidthPx = 200

// wholeHost gives a table's host column hostWidthPx.
func wholeHost(p *table.PanelBuilder) *table.PanelBuilder {
	return p.OverrideByRegexp(fieldRegexp("host"), []dashboard.DynamicConfigValue{prop("custom.width", hostWidthPx)})
}

// rankColumns is the order of the Ranks table's columns, by display name.
var rankColumns = []string{"Rank", "Host", "Straggler", "Named by", "Cause", "Delay", "Straggler score", "Lateness",
	"Own excess", "Hidden wait", "Arrived last", "Busy", "Wait in collective", "Median step", "p95 step", "Waiting on others", "Mean GPU util", "Peak GPU memory", "Steps"}

func columnOrder(names []string) map[string]any {
	out := make(map[string]any, len(names))
	for i, n := range names {
		out[n] = i
	}
	return out
}

// stragglerFlag colours the ranks frame's straggler flag and, through it,
// the whole row of a straggler.
func stragglerFlag(p *table.PanelBuilder) *table.PanelBuilder {
	return wholeHost(p).OverrideByRegexp(fieldRegexp("straggler"), []dashboard.DynamicConfigValue{
		prop("custom.cellOptions", map[string]any{"type": "color-background", "applyToRow": true}),
		prop("custom.width", 105),
		prop("mappings", stragglerMappings()),
	})
}

// stragglerMappings name and colour the straggler flag: red for a
// straggler, no colour otherwise (so only its row stands out).
func stragglerMappings() []any {
	return []any{map[string]any{"type": "value", "options": map[string]any{
		"true":  map[string]any{"text": "straggler", "color": "red", "index": 0},
		"false": map[string]any{"text": "ok", "color": "transparent", "index": 1},
	}}}
}

// topStragglerRows is how many ranks the Top stragglers table lists.
const topStragglerRows = 10

// topStragglers is the ranks table cut to the latest ranks: what a run of
// a thousand ranks needs first. Grafana sorts and cuts the rows; the
// figures are the server's.
func topStragglers(pos dashboard.GridPos) *table.PanelBuilder {
	return stragglerFlag(dataTable("Top stragglers",
		fmt.Sprintf("The %d ranks that hold the others back longest (Delay: their median lateness at the end of backward over the steady state, on a long run the mean over blocks of 100 steps; where lateness names nobody, as with collectives that block the host, how much longer their own data, host and device work is than the median rank's, Own excess), with their host, what named them (lateness, own work or step time), the cause (data, host or gpu), straggler score (the newest EWMA of lateness over busy time), the wait for the slowest rank hidden in their forward and backward, share of steps they arrived last and busy time. Every rank is in the Ranks table below.", topStragglerRows),
		pos, ranksQuery()).
		WithTransformation(dashboard.DataTransformerConfig{
			Id:      "sortBy",
			Options: map[string]any{"fields": map[string]any{}, "sort": []any{map[string]any{"field": "Delay", "desc": true}}},
		}).
		WithTransformation(dashboard.DataTransformerConfig{
			Id:      "limit",
			Options: map[string]any{"limitField": topStragglerRows},
		}).
		WithTransformation(dashboard.DataTransformerConfig{
			Id: "filterFieldsByName",
			Options: map[string]any{"include": map[string]any{"names": []string{"Rank", "Host", "Delay", "Named by", "Cause",
				"Lateness", "Own excess", "Hidden wait", "Straggler score", "Arrived last", "Busy", "Wait in collective", "Straggler"}}},
		}).
		OverrideByRegexp(fieldRegexp("rank"), []dashboard.DynamicConfigValue{prop("custom.width", 60)}).
		NoValue(noRankSteps))
}

// hostsQuery asks for the ranks of $run rolled up by host.
func hostsQuery() api.PluginQuery {
	q := ranksQuery()
	q.Part = api.PartHosts
	return q
}

// hostTable is the ranks rolled up by host, the slowest first, so that a
// slow node reads as one row however many ranks it holds.
func hostTable(pos dashboard.GridPos) *table.PanelBuilder {
	one := 1.0
	return wholeHost(dataTable("Hosts",
		"The ranks of each host, the slowest host first (the one holding the latest rank): how many of its ranks are stragglers, its worst rank, the largest and mean lateness of its ranks, its largest step time, mean GPU utilisation and largest straggler score. A slow node shows as one row with many stragglers; one slow GPU as one straggler on an otherwise ordinary host.",
		pos, hostsQuery()).
		NoValue(noRankSteps).
		OverrideByRegexp(fieldRegexp("stragglers"), []dashboard.DynamicConfigValue{
			prop("custom.cellOptions", map[string]any{"type": "color-background"}),
			prop("thresholds", dashboard.ThresholdsConfig{Mode: dashboard.ThresholdsModeAbsolute, Steps: []dashboard.Threshold{
				{Value: nil, Color: "green"}, {Value: &one, Color: "red"},
			}}),
		}))
}

// bandNote says how a per-rank chart reads past api.MaxRankSeries ranks.
var bandNote = fmt.Sprintf("Past %d ranks a line per rank would be unreadable: the chart shows the ranks' distribution instead (step by step on a short run, in buckets of 100 steps or more on a long one), the median a line, a band from the 5th to the 95th percentile and a fainter one from the lowest to the highest rank, with the lines of the three ranks of the highest mean over the run (the panel's notice says so).",
	api.MaxRankSeries)

// rankStepChart is one step metric of every rank by step, a band past
// api.MaxRankSeries ranks.
func rankStepChart(title, description, unit string, pos dashboard.GridPos, metric string) *trend.PanelBuilder {
	return rankBand(stepChart(title, description+" "+bandNote, unit, pos, stepQuery("all", metric)).Min(0).
		NoValue("not measured by this run: needs watch() on every rank"), metric)
}

// Colours of the distribution band.
const (
	bandColor   = "blue"
	medianColor = "dark-blue"
)

// rankBand draws the distribution the plugin answers for rank=all past
// api.MaxRankSeries ranks (fields named by api.SpreadLabel): the median as a line,
// a band from p5 to p95 inside a fainter one from min to max, each filled
// with Grafana's fill-below-to between its edges. A run of fewer ranks has
// no such fields, and keeps its line per rank. The line of a rank the
// server flags as a straggler (named with api.StragglerSuffix) is
// drawn thick and red; every other line is a shade of the band's blue,
// as Grafana's classic palette has a red of its own ("vm GPU 0" and the
// straggler were drawn alike).
func rankBand[P interface {
	OverrideByName(string, []dashboard.DynamicConfigValue) P
	OverrideByRegexp(string, []dashboard.DynamicConfigValue) P
	ColorScheme(cog.Builder[dashboard.FieldColor]) P
}](p P, metrics ...string) P {
	for _, m := range metrics {
		p = rankBandOf(p, m)
	}
	p = p.ColorScheme(dashboard.NewFieldColorBuilder().Mode(dashboard.FieldColorModeIdShades).FixedColor(bandColor))
	return p.OverrideByRegexp(StragglerSeries, []dashboard.DynamicConfigValue{
		prop("color", map[string]any{"mode": "fixed", "fixedColor": "red"}),
		prop("custom.lineWidth", 3),
	})
}

// StragglerSeries matches the display names of a flagged rank's series.
var StragglerSeries = "/" + regexp.QuoteMeta(api.StragglerSuffix) + "$/"

func rankBandOf[P interface {
	OverrideByName(string, []dashboard.DynamicConfigValue) P
}](p P, metric string) P {
	name := func(q string) string { return api.SpreadLabel(metric, q) }
	color := func(c string) dashboard.DynamicConfigValue {
		return prop("color", map[string]any{"mode": "fixed", "fixedColor": c})
	}
	// The lower edges carry no fill of their own (it would run to the
	// axis) and stay out of the legend: the upper edge names the band.
	lower := []dashboard.DynamicConfigValue{
		prop("custom.lineWidth", 0), prop("custom.fillOpacity", 0), color(bandColor),
		prop("custom.hideFrom", map[string]any{"legend": true, "tooltip": false, "viz": false}),
	}
	upper := func(to string, opacity int) []dashboard.DynamicConfigValue {
		return []dashboard.DynamicConfigValue{
			prop("custom.lineWidth", 0), prop("custom.fillBelowTo", name(to)), prop("custom.fillOpacity", opacity), color(bandColor),
		}
	}
	return p.
		OverrideByName(name(api.SpreadMax), upper(api.SpreadMin, 12)).
		OverrideByName(name(api.SpreadMin), lower).
		OverrideByName(name(api.SpreadP95), upper(api.SpreadP5, 30)).
		OverrideByName(name(api.SpreadP5), lower).
		OverrideByName(name(api.SpreadMedian), []dashboard.DynamicConfigValue{
			prop("custom.lineWidth", 2), prop("custom.fillOpacity", 0), color(medianColor),
		})
}

// rankBarsQuery asks for the bars of one figure of the ranks of $run: a
// bar a rank up to api.MaxRankBars ranks, past that the flagged ranks and
// the others sampled evenly in the figure's order.
func rankBarsQuery(field string) api.PluginQuery {
	q := ranksQuery()
	q.Part, q.Metrics = api.PartBars, []string{field}
	return q
}

// rankBars is one figure of the ranks frame per rank.
func rankBars(title, field, display, unit string, pos dashboard.GridPos) *barchart.PanelBuilder {
	return barchart.NewPanelBuilder().
		Title(title).
		Description(fmt.Sprintf("%s of each rank, the largest first, a straggler's bar red. Past %d ranks the %d bars are the flagged ranks and others picked evenly from the largest to the smallest (the panel's notice says about how many ranks each stands for): the ranks' distribution, the stragglers named at its top. Every rank is in the Ranks table.", display, api.MaxRankBars, api.MaxRankBars)).
		Datasource(DatasourceRef()).
		GridPos(pos).
		WithTarget(target("A", rankBarsQuery(field))).
		WithTransformation(dashboard.DataTransformerConfig{
			Id:      "filterFieldsByName",
			Options: map[string]any{"include": map[string]any{"pattern": fieldRegexp("rank_name", "Rank name", field, display, "straggler")}},
		}).
		// Sorted by the figure, largest first (as the plugin answers):
		// past a few dozen ranks the bars read as the ranks'
		// distribution, the flagged ranks (red) at its top end.
		WithTransformation(dashboard.DataTransformerConfig{
			Id:      "sortBy",
			Options: map[string]any{"fields": map[string]any{}, "sort": []any{map[string]any{"field": display, "desc": true}}},
		}).
		// Bars are labelled with the rank's name ("rank 3"), a string
		// field of the ranks frame.
		XField("Rank name").
		// A straggler's bar is red, the others blue: coloured by the
		// ranks frame's flag through its value mappings.
		ColorByField("Straggler").
		OverrideByRegexp(fieldRegexp("straggler"), []dashboard.DynamicConfigValue{prop("mappings", []any{map[string]any{"type": "value", "options": map[string]any{
			"true":  map[string]any{"text": "straggler", "color": "red", "index": 0},
			"false": map[string]any{"text": "ok", "color": "blue", "index": 1},
		}}})}).
		XTickLabelRotation(0).
		// Values and labels thin out as bars narrow: every bar of a few
		// ranks is labelled, a thousand ranks' bars are not smeared.
		ShowValue(common.VisibilityModeAuto).
		XTickLabelSpacing(60).
		// Grafana writes a skipped label as the field's no-value text: the
		// panel's sentence under every bar, overlapping, unless the rank
		// names have a no-value text of their own, none.
		OverrideByName("Rank name", []dashboard.DynamicConfigValue{prop("noValue", " ")}).
		Stacking(common.StackingModeNone).
		Unit(unit).
		Min(0).
		FillOpacity(80).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(false).DisplayMode(common.LegendDisplayModeHidden).Placement(common.LegendPlacementBottom).Calcs([]string{})).
		NoValue(noRankSteps)
}

// noRankSteps is why the per-rank panels of a run are empty.
const noRankSteps = "no step with timings recorded for this run"

// stragglerScoreChart is each rank's straggler score by step, with the
// straggler alert's default threshold (detect.Defaults) as a dashed line:
// where a rank's line crosses it is when the alert opened.
func stragglerScoreChart(pos dashboard.GridPos) *trend.PanelBuilder {
	limit := detect.Defaults().StragglerPct / 100
	return rankStepChart("Straggler score per rank",
		fmt.Sprintf("Each rank's straggler score by step: an EWMA of its lateness as a share of the ranks' median busy time. The rank whose line rises is the straggler, from the step where it leaves 0; the straggler alert fires while a score is above the dashed line (%g %%, the default straggler_pct; a run's own setting may differ). Scores are those the alert evaluator stored while the run was live; for a run it never scored (finished, imported) they are computed from its records by the same definition.", limit*100),
		"percentunit", pos, "straggler_score").
		NoValue("no straggler score: needs two or more ranks whose steps record their wait at the collective (watch() on every rank)").
		Thresholds(dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps([]dashboard.Threshold{
			{Value: nil, Color: "green"},
			{Value: &limit, Color: "red"},
		})).
		ThresholdsStyle(common.NewGraphThresholdsStyleConfigBuilder().Mode(common.GraphThresholdsStyleModeDashed))
}
