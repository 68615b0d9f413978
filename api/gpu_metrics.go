package api

// GPUMetric is one value of a GPU sample, defined once for every part
// that handles it: the collector reads it from NVML and exports it on
// /metrics, the store writes and reads its column, the query API gives
// its unit and the Grafana plugin its legend.
//
// Adding a GPU value is a row in [GPUMetrics] (with its field in [GPU]
// when it travels in a record), a migration adding its column, and the
// nvml.Reading field the row names, filled by the row of the collector's
// NVML call table that its NVMLCall names and carried by Reading.With
// (which a test holds to the call table); `go test
// ./api ./grafana-plugin/pkg/plugin -update` then writes what is derived
// from the table in files (openapi.json, docs/metrics.md, the plugin
// editor's list).
type GPUMetric struct {
	// Name is the value's name in a gpu record and in the query API
	// (/gpus?metric=); "" for a value only /metrics shows.
	Name string
	// Column is its gpu_samples column; "" when samples do not store it.
	Column string
	// Unit is the unit of the record's value as the query API names it:
	// percent, bytes, W, J, celsius, MHz, bytes/s; "" for counts, codes
	// and masks.
	Unit string
	// Label is a chart legend in words.
	Label string
	// Agg is how a time bucket of /gpus sums up the samples of a stored
	// value.
	Agg GPUAgg
	// Field is the value's field in a record: a **Float, or a **int64 for
	// a bit mask. Nil when Name is "".
	Field func(g *GPU) any

	// NVML names (by its JSON name) the field of the collector's NVML
	// reading, or of the device's facts, the value comes from; "" for a
	// value the collector derives (rates from counters, sums). NVMLScale
	// turns NVML's unit into Unit.
	NVML      string
	NVMLScale float64
	// NVMLCall names the NVML call that gives NVML's reading, as the
	// collector's call table (collector/nvml/real.go) names its rows; ""
	// for a device fact or a derived value. A value from a call of its
	// own gets a row of its own there, and so its own call id: a call a
	// GPU refuses is not made again, and two values sharing one id would
	// both go with the first refusal.
	NVMLCall string

	// Prom is how the collector's /metrics shows the value, DCGM how it
	// shows it under dcgm-exporter's name (with --dcgm-compat); nil: not
	// shown. Their Scale applies to NVML's reading.
	Prom, DCGM *GPUExport
}

// GPUExport is a /metrics family of a GPU value.
type GPUExport struct {
	Name, Help string
	Type       string  // gauge or counter
	Scale      float64 // from NVML's unit to the family's
	// Seq orders the dcgm-exporter families as that exporter does; the
	// DeepSeed families follow the table.
	Seq int
}

// GPUAgg is how a time bucket sums up the samples of a GPU value.
type GPUAgg int

const (
	// AggMean averages gauges and counters; min and max are the bucket's.
	AggMean GPUAgg = iota
	// AggLast keeps the bucket's newest value (the last XID: a mean of
	// error codes names none).
	AggLast
	// AggBits holds every bit any sample set (min: the bits all of them
	// set), for bit masks.
	AggBits
)

func gauge(name, help string, scale float64) *GPUExport {
	return &GPUExport{Name: name, Help: help, Type: "gauge", Scale: scale}
}

func counter(name, help string, scale float64) *GPUExport {
	return &GPUExport{Name: name, Help: help, Type: "counter", Scale: scale}
}

func dcgm(seq int, e *GPUExport) *GPUExport { e.Seq = seq; return e }

// mib turns bytes into dcgm-exporter's MiB.
const mib = 1.0 / (1 << 20)

// GPUMetrics is every value of a GPU sample, in the order of the
// collector's /metrics page.
var GPUMetrics = []GPUMetric{
	{Name: "util_pct", Column: "util_pct", Unit: "percent", Label: "utilisation",
		Field: func(g *GPU) any { return &g.UtilPct }, NVML: "util_gpu_pct", NVMLScale: 1, NVMLCall: "utilization",
		Prom: gauge("deepseed_gpu_utilization_ratio", "Fraction of the last sample period a kernel ran on the GPU.", 0.01),
		DCGM: dcgm(8, gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", 1))},
	{Name: "mem_util_pct", Column: "mem_util_pct", Unit: "percent", Label: "memory bandwidth utilisation",
		Field: func(g *GPU) any { return &g.MemUtilPct }, NVML: "util_mem_pct", NVMLScale: 1, NVMLCall: "utilization",
		Prom: gauge("deepseed_gpu_memory_utilization_ratio", "Fraction of the last sample period device memory was read or written.", 0.01),
		DCGM: dcgm(9, gauge("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", 1))},
	{Name: "mem_used_bytes", Column: "mem_used_bytes", Unit: "bytes", Label: "memory used",
		Field: func(g *GPU) any { return &g.MemUsedBytes }, NVML: "mem_used_bytes", NVMLScale: 1, NVMLCall: "memory_info_v2",
		Prom: gauge("deepseed_gpu_memory_used_bytes", "Device memory in use.", 1),
		DCGM: dcgm(12, gauge("DCGM_FI_DEV_FB_USED", "Frame buffer memory used (in MiB).", mib))},
	{Name: "mem_total_bytes", Column: "mem_total_bytes", Unit: "bytes", Label: "memory total",
		Field: func(g *GPU) any { return &g.MemTotalBytes }, NVML: "mem_total_bytes", NVMLScale: 1, NVMLCall: "memory_info_v2",
		Prom: gauge("deepseed_gpu_memory_total_bytes", "Device memory in total.", 1)},
	{Name: "mem_reserved_bytes", Column: "mem_reserved_bytes", Unit: "bytes", Label: "memory reserved",
		Field: func(g *GPU) any { return &g.MemReservedBytes }, NVML: "mem_reserved_bytes", NVMLScale: 1, NVMLCall: "memory_info_v2",
		Prom: gauge("deepseed_gpu_memory_reserved_bytes", "Device memory reserved by the driver and firmware.", 1),
		DCGM: dcgm(13, gauge("DCGM_FI_DEV_FB_RESERVED", "Frame buffer memory reserved (in MiB).", mib))},
	{NVML: "mem_free_bytes", NVMLCall: "memory_info_v2",
		DCGM: dcgm(11, gauge("DCGM_FI_DEV_FB_FREE", "Frame buffer memory free (in MiB).", mib))},
	{Name: "power_w", Column: "power_w", Unit: "W", Label: "power",
		Field: func(g *GPU) any { return &g.PowerW }, NVML: "power_mw", NVMLScale: 1e-3, NVMLCall: "power_usage",
		Prom: gauge("deepseed_gpu_power_watts", "Power draw.", 1e-3),
		DCGM: dcgm(5, gauge("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", 1e-3))},
	{Name: "energy_j", Column: "energy_j", Unit: "J", Label: "energy",
		Field: func(g *GPU) any { return &g.EnergyJ }, NVML: "energy_mj", NVMLScale: 1e-3, NVMLCall: "total_energy",
		Prom: counter("deepseed_gpu_energy_joules_total", "Energy consumed since the driver was loaded.", 1e-3),
		DCGM: dcgm(6, counter("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", 1))},
	{Name: "temp_c", Column: "temp_c", Unit: "celsius", Label: "temperature",
		Field: func(g *GPU) any { return &g.TempC }, NVML: "temp_c", NVMLScale: 1, NVMLCall: "temperature",
		Prom: gauge("deepseed_gpu_temperature_celsius", "GPU die temperature.", 1),
		DCGM: dcgm(4, gauge("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", 1))},
	{Name: "mem_temp_c", Column: "mem_temp_c", Unit: "celsius", Label: "memory temperature",
		Field: func(g *GPU) any { return &g.MemTempC }, NVML: "mem_temp_c", NVMLScale: 1, NVMLCall: "field_memory_temp",
		Prom: gauge("deepseed_gpu_memory_temperature_celsius", "Device memory temperature.", 1),
		DCGM: dcgm(3, gauge("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", 1))},
	{Name: "sm_clock_mhz", Column: "sm_clock_mhz", Unit: "MHz", Label: "SM clock",
		Field: func(g *GPU) any { return &g.SMClockMHz }, NVML: "sm_clock_mhz", NVMLScale: 1, NVMLCall: "clock_sm",
		Prom: gauge("deepseed_gpu_sm_clock_hertz", "SM clock.", 1e6),
		DCGM: dcgm(1, gauge("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", 1))},
	{Name: "mem_clock_mhz", Column: "mem_clock_mhz", Unit: "MHz", Label: "memory clock",
		Field: func(g *GPU) any { return &g.MemClockMHz }, NVML: "mem_clock_mhz", NVMLScale: 1, NVMLCall: "clock_mem",
		Prom: gauge("deepseed_gpu_memory_clock_hertz", "Memory clock.", 1e6),
		DCGM: dcgm(2, gauge("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", 1))},
	// NVML's PCIe throughput is in KB/s of 1024 bytes.
	{Name: "pcie_tx_bytes_per_s", Column: "pcie_tx_bytes_per_s", Unit: "bytes/s", Label: "PCIe out",
		Field: func(g *GPU) any { return &g.PCIeTxBps }, NVML: "pcie_tx_kbps", NVMLScale: 1024, NVMLCall: "pcie_throughput_tx",
		Prom: gauge("deepseed_gpu_pcie_tx_bytes_per_second", "PCIe transmit throughput.", 1024)},
	{Name: "pcie_rx_bytes_per_s", Column: "pcie_rx_bytes_per_s", Unit: "bytes/s", Label: "PCIe in",
		Field: func(g *GPU) any { return &g.PCIeRxBps }, NVML: "pcie_rx_kbps", NVMLScale: 1024, NVMLCall: "pcie_throughput_rx",
		Prom: gauge("deepseed_gpu_pcie_rx_bytes_per_second", "PCIe receive throughput.", 1024)},
	{Name: "pcie_replay_total", Column: "pcie_replay_total", Label: "PCIe replays",
		Field: func(g *GPU) any { return &g.PCIeReplays }, NVML: "pcie_replays", NVMLScale: 1, NVMLCall: "pcie_replay_counter",
		Prom: counter("deepseed_gpu_pcie_replays_total", "PCIe replays.", 1),
		DCGM: dcgm(7, counter("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", 1))},
	// NVLink's counters in KiB: /metrics shows them, records carry the
	// rates the collector derives from two reads.
	{NVML: "nvlink_tx_kib", NVMLCall: "field_nvlink_throughput",
		Prom: counter("deepseed_gpu_nvlink_tx_bytes_total", "NVLink data transmitted, all links.", 1024)},
	{NVML: "nvlink_rx_kib", NVMLCall: "field_nvlink_throughput",
		Prom: counter("deepseed_gpu_nvlink_rx_bytes_total", "NVLink data received, all links.", 1024)},
	{Name: "nvlink_tx_bytes_per_s", Column: "nvlink_tx_bytes_per_s", Unit: "bytes/s", Label: "NVLink out",
		Field: func(g *GPU) any { return &g.NVLinkTxBps }},
	{Name: "nvlink_rx_bytes_per_s", Column: "nvlink_rx_bytes_per_s", Unit: "bytes/s", Label: "NVLink in",
		Field: func(g *GPU) any { return &g.NVLinkRxBps }},
	{Name: "xid_total", Column: "xid_total", Label: "XID errors",
		Field: func(g *GPU) any { return &g.XIDTotal }, NVML: "xid_count", NVMLScale: 1, NVMLCall: "event_set_wait",
		Prom: counter("deepseed_gpu_xid_errors_total", "XID errors seen since the collector started.", 1)},
	{Name: "xid_last", Column: "xid_last", Label: "last XID", Agg: AggLast,
		Field: func(g *GPU) any { return &g.XIDLast }, NVML: "xid_last", NVMLScale: 1, NVMLCall: "event_set_wait",
		Prom: gauge("deepseed_gpu_xid_last", "The last XID error code seen (0: none).", 1),
		DCGM: dcgm(10, gauge("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", 1))},
	{Name: "ecc_corrected_total", Column: "ecc_corrected_total", Label: "ECC corrected",
		Field: func(g *GPU) any { return &g.ECCCorrected }, NVML: "ecc_corrected", NVMLScale: 1, NVMLCall: "ecc_corrected",
		Prom: counter("deepseed_gpu_ecc_corrected_errors_total", "Corrected ECC errors over the GPU's life.", 1)},
	{Name: "ecc_uncorrected_total", Column: "ecc_uncorrected_total", Label: "ECC uncorrected",
		Field: func(g *GPU) any { return &g.ECCUncorrected }, NVML: "ecc_uncorrected", NVMLScale: 1, NVMLCall: "ecc_uncorrected",
		Prom: counter("deepseed_gpu_ecc_uncorrected_errors_total", "Uncorrected ECC errors over the GPU's life.", 1)},
	// Remapped rows: /metrics shows both kinds, records carry their sum.
	{NVML: "remapped_rows_correctable", NVMLCall: "remapped_rows",
		Prom: gauge("deepseed_gpu_remapped_rows_correctable", "Rows remapped for correctable errors.", 1),
		DCGM: dcgm(15, counter("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors.", 1))},
	{NVML: "remapped_rows_uncorrectable", NVMLCall: "remapped_rows",
		Prom: gauge("deepseed_gpu_remapped_rows_uncorrectable", "Rows remapped for uncorrectable errors.", 1),
		DCGM: dcgm(14, counter("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors.", 1))},
	{Name: "remapped_rows_total", Column: "remapped_rows_total", Label: "remapped rows",
		Field: func(g *GPU) any { return &g.RemappedRows }},
	{NVML: "remap_pending", NVMLCall: "remapped_rows",
		Prom: gauge("deepseed_gpu_remap_pending", "1 while a row remapping waits for a GPU reset.", 1)},
	{Name: "throttle_reasons", Column: "throttle_reasons", Label: "throttle reasons", Agg: AggBits,
		Field: func(g *GPU) any { return &g.ThrottleReasons }, NVML: "clocks_event_reasons", NVMLScale: 1, NVMLCall: "clocks_event_reasons",
		Prom: gauge("deepseed_gpu_clocks_event_reasons", "NVML clocks-event (throttle) reason bit mask.", 1)},
	{NVML: "gpm",
		Prom: gauge("deepseed_gpu_gpm_supported", "1 when NVML's GPM profiling metrics (SM, tensor and DRAM activity) are read on this GPU.", 1)},
	{Name: "sm_active_pct", Column: "sm_active_pct", Unit: "percent", Label: "SM active",
		Field: func(g *GPU) any { return &g.SMActivePct }, NVML: "gpm_sm_active_pct", NVMLScale: 1, NVMLCall: "gpm_metrics",
		Prom: gauge("deepseed_gpu_sm_active_ratio", "GPM: fraction of cycles an SM had a warp resident.", 0.01),
		DCGM: dcgm(17, gauge("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", 0.01))},
	{Name: "sm_occupancy_pct", Column: "sm_occupancy_pct", Unit: "percent", Label: "SM occupancy",
		Field: func(g *GPU) any { return &g.SMOccupancyPct }, NVML: "gpm_sm_occupancy_pct", NVMLScale: 1, NVMLCall: "gpm_metrics",
		Prom: gauge("deepseed_gpu_sm_occupancy_ratio", "GPM: resident warps over the maximum.", 0.01),
		DCGM: dcgm(18, gauge("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM.", 0.01))},
	{Name: "tensor_active_pct", Column: "tensor_active_pct", Unit: "percent", Label: "tensor cores active",
		Field: func(g *GPU) any { return &g.TensorActivePct }, NVML: "gpm_tensor_active_pct", NVMLScale: 1, NVMLCall: "gpm_metrics",
		Prom: gauge("deepseed_gpu_tensor_active_ratio", "GPM: fraction of cycles any tensor pipe was active.", 0.01),
		DCGM: dcgm(19, gauge("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", 0.01))},
	{Name: "gr_engine_active_pct", Column: "gr_engine_active_pct", Unit: "percent", Label: "graphics engine active",
		Field: func(g *GPU) any { return &g.GrEngineActivePct }, NVML: "gpm_graphics_active_pct", NVMLScale: 1, NVMLCall: "gpm_metrics",
		Prom: gauge("deepseed_gpu_graphics_active_ratio", "GPM: fraction of time the graphics/compute engine was active.", 0.01),
		DCGM: dcgm(16, gauge("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", 0.01))},
	{NVML: "gpm_dram_bw_util_pct", NVMLCall: "gpm_metrics",
		Prom: gauge("deepseed_gpu_dram_active_ratio", "GPM: device memory bandwidth used, as a fraction of the peak.", 0.01),
		DCGM: dcgm(20, gauge("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or receiving data.", 0.01))},
	// The interval the collector samples the GPU at: in records and on
	// /metrics, not stored.
	{Name: "sample_interval_s", Unit: "s", Label: "sample interval",
		Field: func(g *GPU) any { return &g.SampleIntervalS },
		Prom:  gauge("deepseed_gpu_sample_interval_seconds", "The interval the GPU is sampled at: the fast one while an announced training process holds it.", 1)},
}

// Value returns the metric's value in g as the database driver takes it:
// nil, a float64 or an int64.
func (m *GPUMetric) Value(g *GPU) any {
	switch p := m.Field(g).(type) {
	case **Float:
		if *p != nil {
			return float64(**p)
		}
	case **int64:
		if *p != nil {
			return **p
		}
	}
	return nil
}

// Set sets the metric's value in g.
func (m *GPUMetric) Set(g *GPU, v float64) {
	switch p := m.Field(g).(type) {
	case **Float:
		*p = F(v)
	case **int64:
		*p = Ptr(int64(v))
	}
}

// GPUColumns lists the metrics samples store, in the table's order.
func GPUColumns() []*GPUMetric {
	var out []*GPUMetric
	for i := range GPUMetrics {
		if GPUMetrics[i].Column != "" {
			out = append(out, &GPUMetrics[i])
		}
	}
	return out
}

// GPUMetricNamed returns the metric of the given name, or nil.
func GPUMetricNamed(name string) *GPUMetric {
	for i := range GPUMetrics {
		if GPUMetrics[i].Name == name && name != "" {
			return &GPUMetrics[i]
		}
	}
	return nil
}
