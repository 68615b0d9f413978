package dashboards

import (
	"regexp"

	"github.com/grafana/grafana-foundation-sdk/go/barchart"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/heatmap"
	"github.com/grafana/grafana-foundation-sdk/go/piechart"

	"github.com/deepseed/deepseed/api"
)

// summaryCards are the seed dashboard's summary cards and the figures an
// engineer checks first, in the run_summary frame's field names (the JSON
// names of [api.RunSummary]).
var summaryCards = []card{
	{"Model", "model", "", -1, "Model name from the run's meta.", "", ""},
	{"Parameters", "param_count", "short", 0, "Parameter count.", "", ""},
	{"GPU", "gpu", "", -1, "GPU model of rank 0.", "", ""},
	{"ZeRO stage", "zero_stage", "none", 0, "DeepSpeed ZeRO stage (FSDP sharding shown as its ZeRO equivalent).", "", ""},
	{"Precision", "precision", "", -1, "fp32, fp16 or bf16.", "", ""},
	{"Effective batch", "effective_batch", "none", 0, "micro batch × gradient accumulation × data-parallel ranks.", "", ""},
	{"Status", "status", "", -1, "running, finished, failed or killed; a running run that has sent nothing for 5 minutes reads \"silent\" and for how long (a job killed without an end record).", "", ""},
	{"Duration", "duration_s", "s", 0, "Wall-clock time from start to end (or to the last record).", "", ""},
	{"Steps", "last_step", "none", 0, "Highest step recorded.", "Last step", ""},
	{"Final loss", "final_loss", "none", 4, "Training loss at the last step; NaN when it was not finite.", "", ""},
	{"Best accuracy", "best_val_accuracy", "percentunit", 1, "Best validation accuracy over all evaluations. Empty: no evaluation of the run had an accuracy.", "Best val accuracy", "no accuracy"},
	{"Final val F1", "final_val_f1", "percentunit", 1, "F1 score of the last evaluation. Empty: no evaluation of the run had an F1.", "", "no F1"},
	{"Throughput/rank", "mean_throughput_sps", "suffix: samples/s", 1, "Mean samples per second of one rank over the run (rank 0's steps); the whole run's throughput is about world size × this, as Compare's Samples/s shows. Empty: " + noStepTimes + ".", "Mean throughput", cardNoSteps},
	{"Mean GPU util", "mean_gpu_util_pct", "percent", 1, "Mean GPU utilisation over the run: as the steps reported it, else from the NVML samples the collectors attributed to the run. Empty: " + noGPUSamples + ".", "", cardNoNVML},
	{"GPU mem peak", "peak_gpu_mem_gb", "decgbytes", 2, "Most device memory in use on any of the run's GPUs as NVML counts it: the allocator's pool plus the CUDA context. Empty: " + noGPUSamples + ".", api.PeakNVMLDisplay, cardNoNVML},
	{"Allocated peak", "peak_gpu_mem_alloc_gb", "decgbytes", 2, "The PyTorch allocator's peak (torch.cuda.max_memory_allocated) on any rank, as the hook measured it: the tensors alone, below the NVML figure. Empty: " + noHookMemory + ".", api.PeakAllocDisplay, cardNoAlloc},
	{"Mean step time", "mean_step_ms", "ms", 1, "Mean time of one training step. Empty: " + noStepTimes + ".", "", cardNoSteps},
	{"Mean TFLOP/s", "mean_tflops", "suffix: TFLOP/s", 1, "Mean model TFLOP/s achieved per GPU: FLOPs per token × tokens of a rank's step ÷ its step time. Empty: " + noFLOPs + ".", "Mean TFLOP/s per GPU", cardNoFLOPs},
	{"Mean MFU", "mean_mfu", "percentunit", 1, "Mean model FLOPs utilisation: TFLOP/s per GPU over its dense peak at the run's precision. Empty: " + noFLOPs + ".", "", cardNoFLOPs},
	{"Skipped steps", "skipped_steps", "none", 0, "Optimizer steps skipped on fp16 overflow.", "", ""},
	{"World size", "world_size", "none", 0, "Number of ranks.", "", ""},
	{"Est. time to finish", "eta_s", "s", 0, "A running run's time left: steps left (total steps from the run's meta − last step) × its steady-state mean step time. Unknown when the run has finished, has sent nothing for longer than the stall alert's limit, or its total steps are unknown.", "", "unknown"},
}

// Why a panel of a run is empty, in one line each: what the run did not
// measure and what measures it.
const (
	noGPUSamples = "not measured for this run: no NVML samples attributed to it (needs deepseed collect on its nodes)"
	noHookMemory = "not measured by this run: needs watch() on a CUDA device"
	noFLOPs      = "not measured by this run: needs watch() and the model's parameter count and tokens per step"
	noStepTimes  = "not measured by this run: needs watch()"
)

// The same, cut to what a summary card holds on one line; its
// description gives the whole reason.
const (
	cardNoNVML  = "no NVML samples"
	cardNoAlloc = "not measured"
	cardNoFLOPs = "no FLOPs counted"
	cardNoSteps = "no step times"
)

func trainingRun() (dashboard.Dashboard, []Annotation, error) {
	b := newDashboard(UIDTrainingRun, "DeepSeed · Training run",
		"One training run: summary cards, GPU, loss and evaluations, throughput, gradients, compute-time breakdown, ZeRO memory, per-layer timing and the run's configuration.",
		"training").
		WithVariable(projectVar()).
		WithVariable(runVar(false))
	b = windowVars(b).
		Link(runLink("Ranks of this run", UIDRanks)).
		Link(runLink("GPUs of this run", UIDGPUNodes))

	y := uint32(0)
	b = b.WithRow(row("Summary", y))
	y++
	for i, c := range summaryCards {
		x, dy := uint32(i%6)*4, uint32(i/6)*3
		b = b.WithPanel(statCard(c, gridPos(x, y+dy, 4, 3), runQuery(api.QueryRunSummary)))
	}
	y += uint32((len(summaryCards)+5)/6) * 3

	b, y = whatChanged(b, y)

	// The invariants the run's numbers break (GET /runs/{id}'s
	// consistency), a sentence each: a number that cannot be true is
	// said so beside the cards that show it.
	b = b.WithPanel(dataTable("Consistency",
		"The server checks every run against invariants: MFU within (0, 1]; forward, backward and optimizer each within the step and together within it plus a tolerance; steps are optimizer steps under gradient accumulation; the precision recorded is the one the run declares. Each row is one the run breaks, with what was seen and on how many steps.",
		gridPos(0, y, 24, 4), runQuery(api.QueryConsistency)).
		NoValue(api.ConsistentText).
		Filterable(false).
		OverrideByName("What it means", []dashboard.DynamicConfigValue{prop("custom.cellOptions", map[string]any{"type": "auto", "wrapText": true})}).
		OverrideByName("Check", []dashboard.DynamicConfigValue{prop("custom.width", 200)}).
		OverrideByName("Seen", []dashboard.DynamicConfigValue{prop("custom.width", 300)}).
		OverrideByName("Steps", []dashboard.DynamicConfigValue{prop("custom.width", 70)}))
	y += 4

	// Hang forensics: each rank's newest report when its steps stopped
	// (or it was told to stop), the rank that stopped first on top.
	b = b.WithPanel(dataTable("Hang reports",
		"When a rank's steps stop for longer than the hook's threshold, or a launcher's timeout sends SIGTERM, each live rank reports where it is: the step, the last collective it entered and whether its GPU completed it (a rank waiting inside one waits for another), and every thread's Python stack; the collector adds a snapshot of the host's GPUs. The rank that stopped first is on top; the hang alert names it. Open a Stack or Full report cell to read it whole. The reports are also marked on the time charts.",
		gridPos(0, y, 24, 6), runQuery(api.QueryHangReports)).
		NoValue("no hang reported: a rank reports one when its steps stop longer than the hook's threshold, or on SIGTERM").
		OverrideByName("Rank", []dashboard.DynamicConfigValue{prop("custom.width", 60)}).
		OverrideByName("Step", []dashboard.DynamicConfigValue{prop("custom.width", 80)}).
		OverrideByName("Stack (main thread)", []dashboard.DynamicConfigValue{prop("custom.inspect", true), prop("custom.width", 320)}).
		OverrideByName("Full report", []dashboard.DynamicConfigValue{prop("custom.inspect", true)}))
	y += 6

	// GPU samples are taken by time, and the run's events (checkpoints,
	// overflow skips, restarts, alerts) are marked in time: these charts
	// keep a time axis, fitted to the run, with each point's step in the
	// tooltip.
	b = b.WithRow(row("GPU (over time, with the run's events)", y))
	y++
	b = b.WithPanel(runTimeSeries("GPU utilisation", "Utilisation of the GPU of rank 0 over the run's time, from the NVML samples the collector attributed to rank 0 (host GPU n), and as the steps reported it where they did; the run's events marked.", "percent",
		gridPos(0, y, 12, 8), rankGPUQuery("0", "util_pct"), stepSeries("0", "gpu_util_pct")).Min(0).Max(100).NoValue(noGPUSamples))
	b = b.WithPanel(runTimeSeries("GPU memory", "Device memory in use on the GPU of rank 0 as NVML counts it (the allocator's pool and the CUDA context) over the run's time, and as the steps reported it where they did; the run's events marked.", "decbytes",
		gridPos(12, y, 12, 8), rankGPUQuery("0", "mem_used_bytes"), stepSeries("0", "gpu_mem_used_gb")).Min(0).NoValue(noGPUSamples))
	y += 8

	// Training curves are read by step, as in the seed: Trend panels with
	// the step on x, over the whole run whatever the time picker says.
	b = b.WithRow(row("Training (by step)", y))
	y++
	evals := runQuery(api.QueryEvals)
	evals.XAxis = "step"
	loss := stepQuery("0", "loss")
	loss.MinMax = true
	b = b.WithPanel(stepChart("Loss and evaluations",
		"Training loss by step (line, with each bucket's min and max) and the evaluations: validation loss on the loss axis, accuracy and F1 on the right axis as dots.",
		"none", gridPos(0, y, 12, 9), loss, evals).
		// Evaluations ("val loss", "val accuracy", "val F1", one set per
		// split) are dots; accuracy and F1 get the right axis.
		OverrideByRegexp(evalPoints, pointsOnly(7)).
		OverrideByRegexp("/accuracy|f1/i", rightAxis("percentunit", prop("min", 0), prop("max", 1))).
		// The evals frame also carries the training loss at each
		// evaluation: the loss line already shows it.
		OverrideByRegexp("/^(train loss at .*)$/i", []dashboard.DynamicConfigValue{
			prop("custom.hideFrom", map[string]any{"legend": true, "tooltip": true, "viz": true}),
		}).
		// A NaN or infinite loss is a red dot where the line breaks off.
		OverrideByRegexp(nonFinitePoints, append(pointsOnly(9), prop("color", map[string]any{"mode": "fixed", "fixedColor": "red"}))).
		// Each bucket's min and max shade a band around the mean.
		OverrideByName("loss max", []dashboard.DynamicConfigValue{
			prop("custom.lineWidth", 0), prop("custom.fillBelowTo", "loss min"), prop("custom.fillOpacity", 20),
			prop("custom.hideFrom", map[string]any{"legend": true, "tooltip": false, "viz": false}),
		}).
		OverrideByName("loss min", []dashboard.DynamicConfigValue{
			prop("custom.lineWidth", 0), prop("custom.fillOpacity", 0),
			prop("custom.hideFrom", map[string]any{"legend": true, "tooltip": false, "viz": false}),
		}))
	b = b.WithPanel(stepChart("Throughput", "Samples per second of rank 0, by step.", "suffix: samples/s",
		gridPos(12, y, 12, 9), stepQuery("0", "throughput_sps")).Min(0).NoValue(noStepTimes))
	y += 9
	b = b.WithPanel(stepChart("Gradient norm, loss scale and learning rate",
		"By step: global gradient L2 norm (left), fp16 dynamic loss scale (right, log 2) and learning rate (right).",
		"none", gridPos(0, y, 12, 9), stepQuery("0", "grad_norm", "loss_scale", "lr")).
		NoValue("not recorded by this run: needs watch(model, optimizer=…) or a DeepSpeed engine").
		OverrideByRegexp("/loss[ _]scale/i", rightAxis("short",
			prop("custom.scaleDistribution", map[string]any{"type": "log", "log": 2}),
			prop("custom.lineStyle", map[string]any{"fill": "dash", "dash": []int{10, 10}}))).
		OverrideByRegexp("/^(lr|learning[ _]rate)/i", rightAxis("sci")))
	// A symmetric log axis: the first steps (compilation, warm-up, often
	// tens of times the rest) do not squash the steady state to the
	// bottom, and parts of 0 ms stay on the chart. Linear below 0.1 ms
	// and soft-bounded at 0: with a threshold of 1 ms Grafana drew a
	// "-1 ms" tick under the chart.
	b = b.WithPanel(stepChart("Step time", "Step time of rank 0 by step, and its parts: forward, backward, optimizer, communication and data loading. Logarithmic axis, so slow first steps leave the steady state readable.",
		"ms", gridPos(12, y, 12, 9), stepQuery("0", "step_ms", "forward_ms", "backward_ms", "optimizer_ms", "comm_ms", "data_ms")).Min(0).
		ScaleDistribution(common.NewScaleDistributionConfigBuilder().Type(common.ScaleDistributionSymlog).Log(10).LinearThreshold(0.1)).
		AxisSoftMin(0).
		NoValue(noStepTimes))
	y += 9
	b = b.WithPanel(stepChart("TFLOP/s and MFU",
		"By step: model TFLOP/s achieved by the GPU of rank 0 (left) and its model FLOPs utilisation (right): the run's FLOPs per token (6 × parameters plus attention, or as set) × the step's tokens ÷ step time, over the GPU's dense peak at the run's precision.",
		"suffix: TFLOP/s", gridPos(0, y, 24, 8), stepQuery("0", "tflops", "mfu")).Min(0).NoValue(noFLOPs).
		// MFU on a 0–100 % axis of its own: on an axis fitted to it, its
		// line would lie on top of the TFLOP/s line.
		OverrideByRegexp("/mfu/i", rightAxis("percentunit", prop("min", 0), prop("max", 1))))
	y += 8

	b = b.WithRow(row("Compute and memory", y))
	y++
	b = b.WithPanel(piechart.NewPanelBuilder().
		Title("Compute time breakdown").
		Description("Mean time of each part of a step over the steady state (warm-up excluded): forward, backward, optimizer, communication, data loading and the rest.").
		Datasource(DatasourceRef()).
		GridPos(gridPos(0, y, 9, 10)).
		WithTarget(target("A", runQuery(api.QueryBreakdown))).
		NoValue(noStepTimes).
		PieType(piechart.PieChartTypeDonut).
		Unit("ms").
		Decimals(1).
		DisplayLabels([]piechart.PieChartLabels{piechart.PieChartLabelsPercent}).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Values(true).Calcs([]string{"lastNotNull"}).Fields("")).
		Legend(piechart.NewPieChartLegendOptionsBuilder().
			ShowLegend(true).
			DisplayMode(common.LegendDisplayModeTable).
			Placement(common.LegendPlacementRight).
			Values([]piechart.PieChartLegendValues{piechart.PieChartLegendValuesValue, piechart.PieChartLegendValuesPercent})))
	b = b.WithPanel(barchart.NewPanelBuilder().
		Title("ZeRO memory per GPU").
		Description("Predicted bytes of parameters, gradients, optimizer state and activations for the run's ZeRO stage, precision and offload, beside the peak GPU memory measured.").
		Datasource(DatasourceRef()).
		GridPos(gridPos(9, y, 9, 10)).
		WithTarget(target("A", runQuery(api.QueryMemory))).
		NoValue("no ZeRO memory breakdown: needs watch() on a DeepSpeed engine, or the export's zero_memory").
		Orientation(common.VizOrientationHorizontal).
		XField("Part").
		ShowValue(common.VisibilityModeAlways).
		// One field per device (GPU, CPU, NVMe): stacked, each part is one
		// bar coloured by where its state lives.
		Stacking(common.StackingModeNormal).
		Unit("decbytes").
		Min(0).
		FillOpacity(80).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom).Calcs([]string{})))
	// The two measured peaks, each named by its source, as on the bars.
	nvml := card{api.PeakNVMLDisplay, "peak_gpu_mem_gb", "decgbytes", 2, "Most device memory in use on any of the run's GPUs as NVML counts it (the allocator's pool and the CUDA context); compare with the predicted bars. Empty: " + noGPUSamples + ".", "", cardNoNVML}
	b = b.WithPanel(statCard(nvml, gridPos(18, y, 6, 4), runQuery(api.QueryRunSummary)).
		ColorMode(common.BigValueColorModeValue))
	alloc := card{api.PeakAllocDisplay, "peak_gpu_mem_alloc_gb", "decgbytes", 2, "The PyTorch allocator's peak on any rank (tensors alone), as the hook measured it. Empty: " + noHookMemory + ".", "", cardNoAlloc}
	b = b.WithPanel(statCard(alloc, gridPos(18, y+4, 6, 3), runQuery(api.QueryRunSummary)).
		ColorMode(common.BigValueColorModeValue))
	skipped := card{"Overflow-skipped steps", "skipped_steps", "none", 0, "Steps the fp16 loss scaler skipped; each is an annotation on the charts.", "Skipped steps", ""}
	b = b.WithPanel(statCard(skipped, gridPos(18, y+7, 6, 3), runQuery(api.QueryRunSummary)))
	y += 10

	b = b.WithRow(row("Per-layer timing", y))
	y++
	for i, pass := range []string{"forward", "backward"} {
		b = b.WithPanel(layerHeatmap(pass, gridPos(uint32(i)*12, y, 12, 16)))
	}
	y += 16

	b = b.WithRow(row("Run details", y))
	y++
	b = b.WithPanel(dataTable("Run details",
		"The run's configuration as given (DeepSpeed config), hyper-parameters, command line, git commit, library versions and host: what the seed dashboard showed as its training notebook.",
		gridPos(0, y, 24, 14), runQuery(api.QueryRunDetails)))
	y += 14
	b = b.WithPanel(dataTable("Code",
		"The code that produced the run, one row per line: the entry script's source, then git diff HEAD (uncommitted changes to tracked files) of its checkout, each cut at 512 KiB with a last line saying so. Filter by File to see one. Empty when the run was started with DEEPSEED_CAPTURE_CODE=0, or imported.",
		gridPos(0, y, 24, 16), runQuery(api.QueryRunCode)).
		NoValue("no code captured: the run was imported, or started with DEEPSEED_CAPTURE_CODE=0").
		OverrideByName("File", []dashboard.DynamicConfigValue{prop("custom.width", 220)}).
		OverrideByName("Line", []dashboard.DynamicConfigValue{prop("custom.width", 70)}).
		OverrideByName("Code", []dashboard.DynamicConfigValue{prop("custom.inspect", true)}))

	d, err := b.Build()
	if err != nil {
		return d, nil, err
	}
	return d, runEvents(), nil
}

// runEvents are the run's events as annotations on every time chart, one
// per event type so each has its own colour and its own toggle at the top
// of the dashboard: checkpoints, fp16 overflow skips, evaluations,
// restarts, the server detectors' alerts, and hang reports.
func runEvents() []Annotation {
	kinds := []struct{ name, eventType, colour string }{
		{"Checkpoints", "checkpoint", "#73BF69"},    // green
		{"Overflow skips", "overflow", "#F2495C"},   // red
		{"Evaluations", "eval", "#5794F2"},          // blue
		{"Restarts", "restart", "#FF9830"},          // orange
		{"Alerts", "alert", "#B877D9"},              // purple
		{"Hangs", api.HangEventTypes[0], "#E02F44"}, // dark red
		{"Hang GPU snapshots", api.HangEventTypes[1], "#C4162A"},
	}
	out := make([]Annotation, len(kinds))
	for i, k := range kinds {
		q := runQuery(api.QueryAnnotations)
		q.EventTypes = []string{k.eventType}
		out[i] = Annotation{
			Name:       k.name,
			Enable:     true,
			IconColor:  k.colour,
			Datasource: DatasourceRef(),
			Target:     Query{PluginQuery: q, RefID: "Anno-" + k.eventType, Datasource: DatasourceRef()},
		}
	}
	return out
}

// layerHeatmap is the seed's per-layer chart: one row per layer in model
// order (first layer on top, full names), one column per step bucket
// labelled by its first step, colour the layer's mean milliseconds in the
// bucket. The plugin sends a heatmap-rows frame with the step as x (so the
// chart needs no time override: it shows the whole run whatever the time
// picker says) and the colour range of most cells, so the transformer
// blocks spread over the scale instead of one slow layer setting its top;
// hovering a cell gives its layer, first step and absolute milliseconds.
// Grafana 12's Heatmap panel puts its step ticks at most nine columns
// apart and draws none when nine columns are narrower than 40 px, and it
// has no x axis title: at most layerColumns columns keep the ticks, the
// title says the axis is the step, the y axis is titled "Layer".
func layerHeatmap(pass string, pos dashboard.GridPos) *heatmap.PanelBuilder {
	q := runQuery(api.QueryHeatmap)
	q.Pass = pass
	q.MaxSteps = layerColumns
	return heatmap.NewPanelBuilder().
		Title("Per-layer " + pass + " time (ms) by step").
		Description("Mean " + pass + " milliseconds of each layer of rank 0: rows are the layers in model order (first layer on top), columns the run's steps. Colours span the range of most cells, so differences between transformer layers show; a much slower or faster layer (an embedding, a head) takes the end colour. Hover a cell for its layer, step and milliseconds.").
		Datasource(DatasourceRef()).
		GridPos(pos).
		WithTarget(target("A", q)).
		// Grafana's no-data text is the same for every run; the run's own
		// reason (its hook's layer_times, "the model is compiled whole …")
		// is the frame's notice, in the panel header.
		NoValue("no per-layer " + pass + " times in this run: a model compiled whole (torch.compile) has none, the header's notice says so; else it needs watch(model)").
		Calculate(false).
		RowsFrame(heatmap.NewRowsHeatmapOptionsBuilder().Value("Mean time").Layout(common.HeatmapCellLayoutAuto)).
		Color(heatmap.NewHeatmapColorOptionsBuilder().
			Mode(heatmap.HeatmapColorModeScheme).
			// Spectral, reversed: fast cells blue, slow ones red. Both
			// ends stand out on the dark theme, where Turbo's low end is
			// near-black and the cells at the bottom of the range (those
			// clipped there too) read as missing.
			Scheme(layerScheme).
			Scale(heatmap.HeatmapColorScaleLinear).
			Exponent(1).
			Steps(128).
			Fill("dark-orange").
			Reverse(true)).
		CellGap(1).
		YAxis(heatmap.NewYAxisConfigBuilder().
			Unit("").
			Reverse(true).
			AxisPlacement(common.AxisPlacementLeft).
			AxisWidth(layerAxisWidth).
			AxisLabel("Layer")).
		CellValues(heatmap.NewCellValuesBuilder().Unit("ms").Decimals(3)).
		ShowValue(common.VisibilityModeNever).
		ShowLegend().
		Mode(common.TooltipDisplayModeSingle).
		ShowColorScale(true).
		HideYHistogram()
}

// nonFinitePoints matches the plugin's marks of NaN and infinite values.
var nonFinitePoints = "/" + regexp.QuoteMeta(api.NonFiniteSuffix) + "$/"

// evalPoints matches the evaluation fields drawn as dots: "<split> loss",
// "<split> accuracy", "<split> F1". The join on the step leaves one frame,
// so they are found by display name, not by query.
const evalPoints = "/^\\S+ (loss|accuracy|f1)$/i"

// layerScheme is the layer heatmaps' colour scheme.
const layerScheme = "Spectral"

// layerColumns is the most step columns a heatmap asks for.
// Nine columns of the plot (a half-width panel at 1280 px, less the
// layer axis) are then about 60 px.
const layerColumns = 60

// layerAxisWidth is the heatmap's y axis in pixels: room for a layer name
// such as "gpt_neox.layers.23.attention" at Grafana's axis font.
const layerAxisWidth = 220
