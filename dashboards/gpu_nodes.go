package dashboards

import (
	"cmp"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/statetimeline"

	"github.com/deepseed/deepseed/api"
)

// gpuTableQuery asks for one table row per GPU of $run (every GPU of the
// time range with All), whatever the host.
func gpuTableQuery() api.PluginQuery {
	q := gpuQuery(api.GPUTableMetrics...)
	q.Host = ""
	q.Format = api.FormatTable
	return q
}

// hostPrefix matches a GPU series' name, "<host> GPU <n>[ <metric>]", and
// keeps what follows the host (host names hold no spaces).
const hostPrefix = `^\S+ (GPU \d+.*)$`

// gpuQuery asks for GPU telemetry of the host picked in $host, every GPU.
func gpuQuery(metrics ...string) api.PluginQuery {
	return api.PluginQuery{QueryType: api.QueryGPUs, Host: "$" + varHost, RunID: "$" + varRun, Metrics: metrics}
}

// fleetTablePoints is as many points per GPU as the fleet table asks for:
// it shows each GPU's last and mean values, and a thousand GPUs at a
// panel's width of points each would be millions of rows.
const fleetTablePoints = 60

// gpuNoValue says why a GPU chart can be empty where NVML cannot measure
// it; a chart not listed says no sample came in the time range.
var gpuNoValue = map[string]string{
	"SM activity":    "not measured on these GPUs: needs GPM (Hopper or newer)",
	"NVLink traffic": "not measured on these GPUs: no NVLink (PCIe only), or no sample in the range",
}

// throttleReasons names the NVML clocks-event reasons, one bit each; a
// sample with several bits set shows its number.
var throttleReasons = map[string]string{
	"0":   "none",
	"1":   "GPU idle",
	"2":   "application clocks",
	"4":   "SW power cap",
	"8":   "HW slowdown",
	"16":  "sync boost",
	"32":  "SW thermal",
	"64":  "HW thermal",
	"128": "HW power brake",
	"256": "display clocks",
}

func throttleMappings() []dashboard.ValueMapping {
	opts := make(map[string]dashboard.ValueMappingResult)
	i := int32(0)
	for _, v := range []string{"0", "1", "2", "4", "8", "16", "32", "64", "128", "256"} {
		color := "orange"
		switch v {
		case "0", "1":
			color = "green"
		case "8", "32", "64", "128":
			color = "red"
		}
		opts[v] = dashboard.ValueMappingResult{Text: ptr(throttleReasons[v]), Color: ptr(color), Index: ptr(i)}
		i++
	}
	return []dashboard.ValueMapping{{ValueMap: &dashboard.ValueMap{Type: dashboard.MappingTypeValueToText, Options: opts}}}
}

// gpuChartHeight is the height of a host's charts: enough for a table
// legend of sixteen rows (eight GPUs, two metrics).
const gpuChartHeight = 12

func gpuNodes() (dashboard.Dashboard, []Annotation, error) {
	b := newDashboard(UIDGPUNodes, "DeepSeed · GPU nodes",
		"Every GPU of every host, from the node collectors: utilisation, memory, power, temperature, clocks, PCIe and NVLink traffic, errors, throttle reasons, and the run holding each GPU.",
		"gpu").
		Time("now-6h", "now").
		Refresh("30s").
		WithVariable(projectVar()).
		// $run filters to the GPUs the collectors attributed to the run;
		// All (the default) shows every GPU.
		WithVariable(runVar(false).IncludeAll(true).AllValue(api.AllValue)).
		// One host at a time, the first by name when the dashboard
		// opens: a section per host of 128 hosts is a page nobody reads
		// and a thousand queries; the fleet table above lists them all.
		WithVariable(queryVar(varHost, "Host", api.VariableQuery{Resource: api.VariableHosts, Run: "$" + varRun}).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged))
	// Opened directly it shows the last 6 hours; one click fits the range
	// to the chosen run, or with All to the project's newest run, as the
	// links from the Training run and Ranks dashboards do.
	b = windowVars(b).
		Link(runLink("Fit the time range to the run (All: the newest run)", UIDGPUNodes))

	y := uint32(0)
	b = b.WithRow(row("Fleet", y))
	y++
	b = b.WithPanel(dataTable("GPUs, the least busy first",
		"One row per GPU of the run (with All, of every host in the time range): host, GPU, model, the run holding it at the last sample, utilisation (last and mean over the range), memory used and total, temperature and power. The GPUs of lowest mean utilisation come first: an idle or stalled GPU tops the list. Pick a host above for its charts below.",
		gridPos(0, y, 24, 9), gpuTableQuery()).
		MaxDataPoints(fleetTablePoints).
		NoValue("no GPU sample in the time range").
		WithTransformation(dashboard.DataTransformerConfig{
			Id:      "sortBy",
			Options: map[string]any{"fields": map[string]any{}, "sort": []any{map[string]any{"field": "Util (mean)", "desc": false}}},
		}).
		// Grafana shares a table's width equally among its columns: the
		// GPU index needs little, a model name ("NVIDIA H100 80GB HBM3")
		// and a run id more, or they are cut.
		OverrideByName("GPU", []dashboard.DynamicConfigValue{prop("custom.width", 60)}).
		OverrideByName("Model", []dashboard.DynamicConfigValue{prop("custom.width", 210)}).
		OverrideByName("Run", []dashboard.DynamicConfigValue{prop("custom.width", 170)}).
		OverrideByName("Host", []dashboard.DynamicConfigValue{prop("custom.width", hostWidthPx)}))
	y += 9
	b = b.WithRow(row("Host $host", y))
	y++
	// A chart's unit is its first metric's, from the GPU metric table.
	type chart struct {
		title, desc string
		metrics     []string
	}
	charts := []chart{
		{"GPU utilisation", "Share of time a kernel ran.", []string{"util_pct"}},
		{"GPU memory used", "Device memory in use.", []string{"mem_used_bytes", "mem_total_bytes"}},
		{"Power", "Board power draw.", []string{"power_w"}},
		{"Temperature", "GPU and memory temperature.", []string{"temp_c", "mem_temp_c"}},
		{"Clocks", "SM and memory clocks.", []string{"sm_clock_mhz", "mem_clock_mhz"}},
		{"SM activity", "SM active, occupancy and tensor-core activity (GPM, Hopper and newer).", []string{"sm_active_pct", "sm_occupancy_pct", "tensor_active_pct"}},
		{"PCIe traffic", "Bytes per second over PCIe, transmit and receive.", []string{"pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"}},
		{"NVLink traffic", "Bytes per second over NVLink, transmit and receive.", []string{"nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s"}},
		{"Errors", "ECC errors, XID errors, PCIe replays and remapped rows: counters since boot; any rise deserves a look.", []string{"ecc_corrected_total", "ecc_uncorrected_total", "xid_total", "pcie_replay_total", "remapped_rows_total"}},
	}
	// Two charts a row, each legend a table on the right with every
	// series' last and highest value: a host's eight GPUs, two metrics
	// each, are sixteen entries, which a list below the chart cut at the
	// fourth.
	for i, c := range charts {
		unit, err := chartUnit(c.metrics)
		if err != nil {
			return dashboard.Dashboard{}, nil, fmt.Errorf("gpu nodes: chart %s: %w", c.title, err)
		}
		p := timeSeries(c.title, c.desc, unit, gridPos(uint32(i%2)*12, y+uint32(i/2)*gpuChartHeight, 12, gpuChartHeight), gpuQuery(c.metrics...)).Min(0).
			NoValue(cmp.Or(gpuNoValue[c.title], "no GPU sample of this host in the time range")).
			Legend(common.NewVizLegendOptionsBuilder().
				ShowLegend(true).
				DisplayMode(common.LegendDisplayModeTable).
				Placement(common.LegendPlacementRight).
				Calcs([]string{"lastNotNull", "max"})).
			// The section is one host's: its name before every entry
			// ("node-000 GPU 3 memory used") pushed the legend's
			// figures out of a half-width panel.
			WithTransformation(dashboard.DataTransformerConfig{Id: "renameByRegex", Options: map[string]any{
				"regex": hostPrefix, "renamePattern": "$1"}})
		if c.metrics[0] == "util_pct" {
			p = p.Max(100)
		}
		b = b.WithPanel(p)
	}
	y += uint32((len(charts)+1)/2) * gpuChartHeight
	b = b.WithPanel(statetimeline.NewPanelBuilder().
		Title("Throttle reasons").
		Description("Why the clocks were below maximum (NVML clocks-event reasons). Thermal, power-brake and hardware slowdowns slow training.").
		Datasource(DatasourceRef()).
		GridPos(gridPos(0, y, 24, 7)).
		WithTarget(target("A", gpuQuery("throttle_reasons"))).
		Mappings(throttleMappings()).
		ShowValue(common.VisibilityModeAuto).
		MergeValues(true).
		NoValue("no throttle reading of this host in the time range").
		RowHeight(0.8).
		FillOpacity(80).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom).Calcs([]string{})))

	d, err := b.Build()
	return d, nil, err
}

// chartUnit is the Grafana unit of a chart of GPU metrics: their unit in
// the metric table, which they must share.
func chartUnit(metrics []string) (string, error) {
	unit := ""
	for i, name := range metrics {
		m := api.GPUMetricNamed(name)
		if m == nil {
			return "", fmt.Errorf("%s is no GPU metric", name)
		}
		if i > 0 && m.Unit != unit {
			return "", fmt.Errorf("%s is in %q, %s in %q: one chart, one unit", name, m.Unit, metrics[0], unit)
		}
		unit = m.Unit
	}
	return api.GrafanaUnit(unit), nil
}
