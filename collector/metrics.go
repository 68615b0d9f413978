package collector

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
)

// collectorMetrics is the collector's own health, written with the GPU
// and host samples on /metrics.
type collectorMetrics struct {
	received     counter
	forwarded    counter
	failed       counter
	droppedFull  counter // sampled records dropped for room under --spool-max-bytes
	droppedWrite counter // sampled records the spool could not write (disk full …)
	hookFull     counter // hook requests answered 503: the spool could not take them
	deadLettered counter
	sendErrors   counter
	hookRejected counter

	lastSend atomic.Int64 // Unix milliseconds of the last accepted batch
	gpuUp    atomic.Bool
	hostUp   atomic.Bool
}

// counter is a monotonic count for /metrics.
type counter struct{ n atomic.Uint64 }

func (c *counter) Inc()           { c.n.Add(1) }
func (c *counter) Add(n int)      { c.n.Add(uint64(n)) }
func (c *counter) value() float64 { return float64(c.n.Load()) }

func newCollectorMetrics() *collectorMetrics { return &collectorMetrics{} }

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// health is one family of the collector's own metrics; a family with
// labels lists its samples' label sets and values in labels.
type health struct {
	name, help, typ string
	val             func() float64
	labels          []labeled
}

type labeled struct {
	labels string
	val    func() float64
}

func (c *Collector) healthFamilies() []health {
	m := c.m
	return []health{
		{"deepseed_collector_hook_records_received_total", "Records the hook receiver took into the queue.", "counter", m.received.value, nil},
		{"deepseed_collector_hook_requests_rejected_total", "Hook requests answered 4xx: bodies that could not be read or held an invalid record.", "counter", m.hookRejected.value, nil},
		{"deepseed_collector_hook_requests_deferred_total", "Hook requests answered 503 because the spool could not take them.", "counter", m.hookFull.value, nil},
		{"deepseed_collector_records_forwarded_total", "Records the server acknowledged.", "counter", m.forwarded.value, nil},
		{"deepseed_collector_records_failed_total", "Records in sends that failed; they stay in the spool and are sent again.", "counter", m.failed.value, nil},
		{"deepseed_collector_records_dropped_total", "Sampled records dropped: to make room under the spool's bound, or because the spool could not be written.", "counter", nil, []labeled{
			{`reason="spool_full"`, m.droppedFull.value},
			{`reason="write_failed"`, m.droppedWrite.value},
		}},
		{"deepseed_collector_records_dead_lettered_total", "Records the server refused, written to the dead-letter file.", "counter", m.deadLettered.value, nil},
		{"deepseed_collector_send_errors_total", "Sends to the server that failed.", "counter", m.sendErrors.value, nil},
		{"deepseed_collector_queue_records", "Records waiting to be sent, in memory and in the spool.", "gauge", func() float64 { return float64(c.queueDepth()) }, nil},
		{"deepseed_collector_spool_bytes", "Bytes of the batches in the spool.", "gauge", func() float64 { return float64(c.spool.size()) }, nil},
		{"deepseed_collector_spool_records", "Records in the spool waiting for the server: the hook's, acknowledged and never dropped, and the collector's own samples, dropped first when the spool is full.", "gauge", nil, []labeled{
			{`source="hook"`, func() float64 { n, s := c.spool.counts(); return float64(n - s) }},
			{`source="sampled"`, func() float64 { _, s := c.spool.counts(); return float64(s) }},
		}},
		{"deepseed_collector_forward_lag_seconds", "Age of the oldest hook record acknowledged and not yet stored by the server (0: none waiting).", "gauge", c.forwardLag, nil},
		{"deepseed_collector_spool_batches", "Batches in the spool.", "gauge", func() float64 { return float64(c.spool.len()) }, nil},
		{"deepseed_collector_last_send_timestamp_seconds", "Unix time of the last batch the server acknowledged (0: none yet).", "gauge", func() float64 { return float64(m.lastSend.Load()) / 1000 }, nil},
		{"deepseed_gpu_sampling_up", "1 while the last GPU sample through NVML succeeded.", "gauge", func() float64 { return b2f(m.gpuUp.Load()) }, nil},
		{"deepseed_host_sampling_up", "1 while the last host sample succeeded.", "gauge", func() float64 { return b2f(m.hostUp.Load()) }, nil},
		{"deepseed_gpu_count", "GPUs (and MIG instances) NVML shows.", "gauge", func() float64 { return float64(len(c.gpu.devs)) }, nil},
	}
}

// forwardLag is the age of the oldest acknowledged hook record the server
// does not have yet.
func (c *Collector) forwardLag() float64 {
	t, ok := c.spool.oldestHook()
	if !ok {
		return 0
	}
	return max(c.now().Sub(t).Seconds(), 0)
}

// WriteMetrics writes /metrics in the Prometheus text format (version
// 0.0.4): every family under its # HELP and # TYPE lines.
func (c *Collector) WriteMetrics(w io.Writer) {
	bw := bufio.NewWriter(w)
	defer bw.Flush()
	for _, f := range c.healthFamilies() {
		header(bw, f.name, f.help, f.typ)
		if f.val != nil {
			fmt.Fprintf(bw, "%s %s\n", f.name, num(f.val()))
		}
		for _, l := range f.labels {
			fmt.Fprintf(bw, "%s{%s} %s\n", f.name, l.labels, num(l.val()))
		}
	}
	c.writeSamples(bw)
}

// MetricsHandler answers GET /metrics.
func (c *Collector) MetricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed: use GET", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		if r.Method == http.MethodHead {
			return
		}
		c.WriteMetrics(w)
	})
}

// writeSamples writes the latest GPU and host samples. The label sets
// change as processes come and go, so they are written from the snapshot
// on each scrape rather than kept as registered metrics that would go
// stale.
func (c *Collector) writeSamples(bw *bufio.Writer) {
	c.snapMu.Lock()
	gpus, host := c.gpus, c.host
	c.snapMu.Unlock()
	c.writeGPU(bw, gpus)
	if host != nil {
		c.writeHost(bw, host)
	}
	if c.cfg.DCGMCompat {
		c.writeDCGM(bw, gpus)
	}
}

type family struct {
	name, help, typ string
	val             func(s *gpuState) *float64
}

func u32p(p *uint32, scale float64) *float64 {
	if p == nil {
		return nil
	}
	return ptrF(float64(*p) * scale)
}

func u64p(p *uint64, scale float64) *float64 {
	if p == nil {
		return nil
	}
	return ptrF(float64(*p) * scale)
}

func f64p(p *float64, scale float64) *float64 {
	if p == nil {
		return nil
	}
	return ptrF(*p * scale)
}

var gpuFamilies = []family{
	{"deepseed_gpu_utilization_ratio", "Fraction of the last sample period a kernel ran on the GPU.", "gauge", func(s *gpuState) *float64 { return u32p(s.r.UtilGPUPct, 0.01) }},
	{"deepseed_gpu_memory_utilization_ratio", "Fraction of the last sample period device memory was read or written.", "gauge", func(s *gpuState) *float64 { return u32p(s.r.UtilMemPct, 0.01) }},
	{"deepseed_gpu_memory_used_bytes", "Device memory in use.", "gauge", func(s *gpuState) *float64 { return u64p(s.r.MemUsedBytes, 1) }},
	{"deepseed_gpu_memory_total_bytes", "Device memory in total.", "gauge", func(s *gpuState) *float64 { return u64p(s.r.MemTotalBytes, 1) }},
	{"deepseed_gpu_memory_reserved_bytes", "Device memory reserved by the driver and firmware.", "gauge", func(s *gpuState) *float64 { return u64p(s.r.MemReservedBytes, 1) }},
	{"deepseed_gpu_power_watts", "Power draw.", "gauge", func(s *gpuState) *float64 { return u32p(s.r.PowerMilliW, 1e-3) }},
	{"deepseed_gpu_energy_joules_total", "Energy consumed since the driver was loaded.", "counter", func(s *gpuState) *float64 { return u64p(s.r.EnergyMilliJ, 1e-3) }},
	{"deepseed_gpu_temperature_celsius", "GPU die temperature.", "gauge", func(s *gpuState) *float64 { return u32p(s.r.TempC, 1) }},
	{"deepseed_gpu_memory_temperature_celsius", "Device memory temperature.", "gauge", func(s *gpuState) *float64 { return u32p(s.r.MemTempC, 1) }},
	{"deepseed_gpu_sm_clock_hertz", "SM clock.", "gauge", func(s *gpuState) *float64 { return u32p(s.r.SMClockMHz, 1e6) }},
	{"deepseed_gpu_memory_clock_hertz", "Memory clock.", "gauge", func(s *gpuState) *float64 { return u32p(s.r.MemClockMHz, 1e6) }},
	{"deepseed_gpu_pcie_tx_bytes_per_second", "PCIe transmit throughput.", "gauge", func(s *gpuState) *float64 { return u32p(s.r.PCIeTxKBps, 1024) }},
	{"deepseed_gpu_pcie_rx_bytes_per_second", "PCIe receive throughput.", "gauge", func(s *gpuState) *float64 { return u32p(s.r.PCIeRxKBps, 1024) }},
	{"deepseed_gpu_pcie_replays_total", "PCIe replays.", "counter", func(s *gpuState) *float64 { return u64p(s.r.PCIeReplays, 1) }},
	{"deepseed_gpu_nvlink_tx_bytes_total", "NVLink data transmitted, all links.", "counter", func(s *gpuState) *float64 { return u64p(s.r.NVLinkTxKiB, 1024) }},
	{"deepseed_gpu_nvlink_rx_bytes_total", "NVLink data received, all links.", "counter", func(s *gpuState) *float64 { return u64p(s.r.NVLinkRxKiB, 1024) }},
	{"deepseed_gpu_xid_errors_total", "XID errors seen since the collector started.", "counter", func(s *gpuState) *float64 { return u64p(s.r.XIDCount, 1) }},
	{"deepseed_gpu_xid_last", "The last XID error code seen (0: none).", "gauge", func(s *gpuState) *float64 { return u64p(s.r.XIDLast, 1) }},
	{"deepseed_gpu_ecc_corrected_errors_total", "Corrected ECC errors over the GPU's life.", "counter", func(s *gpuState) *float64 { return u64p(s.r.ECCCorrected, 1) }},
	{"deepseed_gpu_ecc_uncorrected_errors_total", "Uncorrected ECC errors over the GPU's life.", "counter", func(s *gpuState) *float64 { return u64p(s.r.ECCUncorrected, 1) }},
	{"deepseed_gpu_remapped_rows_correctable", "Rows remapped for correctable errors.", "gauge", func(s *gpuState) *float64 { return u64p(s.r.RemappedCorr, 1) }},
	{"deepseed_gpu_remapped_rows_uncorrectable", "Rows remapped for uncorrectable errors.", "gauge", func(s *gpuState) *float64 { return u64p(s.r.RemappedUncorr, 1) }},
	{"deepseed_gpu_remap_pending", "1 while a row remapping waits for a GPU reset.", "gauge", func(s *gpuState) *float64 {
		if s.r.RemapPending == nil {
			return nil
		}
		return ptrF(b2f(*s.r.RemapPending))
	}},
	{"deepseed_gpu_clocks_event_reasons", "NVML clocks-event (throttle) reason bit mask.", "gauge", func(s *gpuState) *float64 { return u64p(s.r.ClocksEventMask, 1) }},
	{"deepseed_gpu_gpm_supported", "1 when NVML's GPM profiling metrics (SM, tensor and DRAM activity) are read on this GPU.", "gauge", func(s *gpuState) *float64 { return ptrF(b2f(s.info.GPM)) }},
	{"deepseed_gpu_sm_active_ratio", "GPM: fraction of cycles an SM had a warp resident.", "gauge", func(s *gpuState) *float64 { return f64p(s.r.GPMSMActivePct, 0.01) }},
	{"deepseed_gpu_sm_occupancy_ratio", "GPM: resident warps over the maximum.", "gauge", func(s *gpuState) *float64 { return f64p(s.r.GPMSMOccupancy, 0.01) }},
	{"deepseed_gpu_tensor_active_ratio", "GPM: fraction of cycles any tensor pipe was active.", "gauge", func(s *gpuState) *float64 { return f64p(s.r.GPMTensorPct, 0.01) }},
	{"deepseed_gpu_graphics_active_ratio", "GPM: fraction of time the graphics/compute engine was active.", "gauge", func(s *gpuState) *float64 { return f64p(s.r.GPMGraphicsPct, 0.01) }},
	{"deepseed_gpu_dram_active_ratio", "GPM: device memory bandwidth used, as a fraction of the peak.", "gauge", func(s *gpuState) *float64 { return f64p(s.r.GPMDRAMBWPct, 0.01) }},
	{"deepseed_gpu_sample_interval_seconds", "The interval the GPU is sampled at: the fast one while an announced training process holds it.", "gauge", func(s *gpuState) *float64 { return &s.interval }},
}

func (c *Collector) gpuLabels(s *gpuState) string {
	var b strings.Builder
	fmt.Fprintf(&b, `host=%s,gpu="%d",uuid=%s`, q(c.cfg.HostName), s.info.Index, q(s.info.UUID))
	if s.info.MIG != nil {
		fmt.Fprintf(&b, `,gpu_instance="%d",gpu_profile=%s`, s.info.MIG.GPUInstanceID, q(s.info.MIG.Profile))
	}
	return b.String()
}

func (c *Collector) writeGPU(w *bufio.Writer, gpus []gpuState) {
	if len(gpus) > 0 {
		header(w, "deepseed_gpu_info", "Static facts of each GPU; always 1.", "gauge")
		for i := range gpus {
			s := &gpus[i]
			fmt.Fprintf(w, "deepseed_gpu_info{%s,name=%s,pci_bus_id=%s} 1\n", c.gpuLabels(s), q(s.info.Name), q(s.info.PCIBusID))
		}
	}
	writeFamilies(w, gpuFamilies, gpus, c.gpuLabels)
	wrote := false
	for i := range gpus {
		s := &gpus[i]
		if s.rec.RunID == "" {
			continue
		}
		if !wrote {
			header(w, "deepseed_gpu_run", "The run and rank a GPU's samples are attributed to; always 1.", "gauge")
			wrote = true
		}
		fmt.Fprintf(w, "deepseed_gpu_run{%s,run_id=%s,rank=\"%d\"} 1\n", c.gpuLabels(s), q(s.rec.RunID), *s.rec.Rank)
	}
	wrote = false
	for i := range gpus {
		s := &gpus[i]
		for _, p := range s.procs {
			if p.memBytes == nil {
				continue
			}
			if !wrote {
				header(w, "deepseed_gpu_process_memory_bytes", "Device memory used by each compute process.", "gauge")
				wrote = true
			}
			runID, rank := "", ""
			if p.who != nil {
				runID, rank = p.who.RunID, strconv.Itoa(p.who.Rank)
			}
			fmt.Fprintf(w, "deepseed_gpu_process_memory_bytes{%s,pid=\"%d\",run_id=%s,rank=%s} %s\n", c.gpuLabels(s), p.pid, q(runID), q(rank), num(*p.memBytes))
		}
	}
}

func (c *Collector) writeHost(w *bufio.Writer, h *hostReading) {
	hl := "host=" + q(c.cfg.HostName)
	one := func(name, help, typ string, v *float64) {
		if v == nil {
			return
		}
		header(w, name, help, typ)
		fmt.Fprintf(w, "%s{%s} %s\n", name, hl, num(*v))
	}
	if h.rec.CPUUtilPct != nil {
		one("deepseed_host_cpu_utilization_ratio", "Fraction of all CPUs' time spent busy over the last sample period.", "gauge", ptrF(float64(*h.rec.CPUUtilPct)/100))
	}
	if h.rec.MemUsedBytes != nil {
		one("deepseed_host_memory_used_bytes", "Host memory in use (total less available).", "gauge", ptrF(float64(*h.rec.MemUsedBytes)))
		one("deepseed_host_memory_total_bytes", "Host memory in total.", "gauge", ptrF(float64(*h.rec.MemTotalBytes)))
	}
	if h.rec.Load1 != nil {
		one("deepseed_host_load1", "One-minute load average.", "gauge", ptrF(float64(*h.rec.Load1)))
	}
	procLabels := func(p hostProc) string {
		return fmt.Sprintf(`%s,pid="%d",run_id=%s,rank="%d",local_rank="%d"`, hl, p.p.PID, q(p.p.RunID), p.p.Rank, p.p.LocalRank)
	}
	families := []struct {
		name, help, typ string
		val             func(p hostProc) *float64
	}{
		{"deepseed_host_process_cpu_seconds_total", "CPU time of each announced training process.", "counter", func(p hostProc) *float64 {
			if p.gone {
				return nil
			}
			return ptrF(p.cpuSecs)
		}},
		{"deepseed_host_process_cpu_ratio", "CPU use of each announced training process over the last sample period, in cores.", "gauge", func(p hostProc) *float64 {
			return f64p(p.cpuPct, 0.01)
		}},
		{"deepseed_host_process_resident_memory_bytes", "Resident memory of each announced training process.", "gauge", func(p hostProc) *float64 { return p.rssBytes }},
	}
	for _, f := range families {
		wrote := false
		for _, p := range h.procs {
			v := f.val(p)
			if v == nil {
				continue
			}
			if !wrote {
				header(w, f.name, f.help, f.typ)
				wrote = true
			}
			fmt.Fprintf(w, "%s{%s} %s\n", f.name, procLabels(p), num(*v))
		}
	}
}

// dcgmFamilies are the dcgm-exporter fields NVIDIA's Grafana dashboard
// 12239 and common alerts read, in dcgm-exporter's units: MiB for frame
// buffer, MHz, watts, millijoules, percent for DEV utilisation and ratios
// (0–1) for the PROF fields.
var dcgmFamilies = []family{
	{"DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "gauge", func(s *gpuState) *float64 { return u32p(s.r.SMClockMHz, 1) }},
	{"DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "gauge", func(s *gpuState) *float64 { return u32p(s.r.MemClockMHz, 1) }},
	{"DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", "gauge", func(s *gpuState) *float64 { return u32p(s.r.MemTempC, 1) }},
	{"DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "gauge", func(s *gpuState) *float64 { return u32p(s.r.TempC, 1) }},
	{"DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "gauge", func(s *gpuState) *float64 { return u32p(s.r.PowerMilliW, 1e-3) }},
	{"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", "counter", func(s *gpuState) *float64 { return u64p(s.r.EnergyMilliJ, 1) }},
	{"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", "counter", func(s *gpuState) *float64 { return u64p(s.r.PCIeReplays, 1) }},
	{"DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gauge", func(s *gpuState) *float64 { return u32p(s.r.UtilGPUPct, 1) }},
	{"DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "gauge", func(s *gpuState) *float64 { return u32p(s.r.UtilMemPct, 1) }},
	{"DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "gauge", func(s *gpuState) *float64 { return u64p(s.r.XIDLast, 1) }},
	{"DCGM_FI_DEV_FB_FREE", "Frame buffer memory free (in MiB).", "gauge", func(s *gpuState) *float64 { return u64p(s.r.MemFreeBytes, 1.0/(1<<20)) }},
	{"DCGM_FI_DEV_FB_USED", "Frame buffer memory used (in MiB).", "gauge", func(s *gpuState) *float64 { return u64p(s.r.MemUsedBytes, 1.0/(1<<20)) }},
	{"DCGM_FI_DEV_FB_RESERVED", "Frame buffer memory reserved (in MiB).", "gauge", func(s *gpuState) *float64 { return u64p(s.r.MemReservedBytes, 1.0/(1<<20)) }},
	{"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors.", "counter", func(s *gpuState) *float64 { return u64p(s.r.RemappedUncorr, 1) }},
	{"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors.", "counter", func(s *gpuState) *float64 { return u64p(s.r.RemappedCorr, 1) }},
	{"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", "gauge", func(s *gpuState) *float64 { return f64p(s.r.GPMGraphicsPct, 0.01) }},
	{"DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", "gauge", func(s *gpuState) *float64 { return f64p(s.r.GPMSMActivePct, 0.01) }},
	{"DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM.", "gauge", func(s *gpuState) *float64 { return f64p(s.r.GPMSMOccupancy, 0.01) }},
	{"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", "gauge", func(s *gpuState) *float64 { return f64p(s.r.GPMTensorPct, 0.01) }},
	{"DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or receiving data.", "gauge", func(s *gpuState) *float64 { return f64p(s.r.GPMDRAMBWPct, 0.01) }},
}

// dcgmLabels follows dcgm-exporter's label names and order: gpu, UUID,
// pci_bus_id, device, modelName, then GPU_I_PROFILE and GPU_I_ID on MIG
// instances, then Hostname. On MIG, UUID is the parent GPU's, as there.
func (c *Collector) dcgmLabels(s *gpuState) string {
	var b strings.Builder
	uuid := s.info.UUID
	if s.info.MIG != nil {
		uuid = s.info.MIG.ParentUUID
	}
	fmt.Fprintf(&b, `gpu="%d",UUID=%s,pci_bus_id=%s,device="nvidia%d",modelName=%s`, s.info.Index, q(uuid), q(s.info.PCIBusID), s.info.Minor, q(s.info.Name))
	if s.info.MIG != nil {
		fmt.Fprintf(&b, `,GPU_I_PROFILE=%s,GPU_I_ID="%d"`, q(s.info.MIG.Profile), s.info.MIG.GPUInstanceID)
	}
	fmt.Fprintf(&b, `,Hostname=%s`, q(c.cfg.HostName))
	return b.String()
}

func (c *Collector) writeDCGM(w *bufio.Writer, gpus []gpuState) {
	writeFamilies(w, dcgmFamilies, gpus, c.dcgmLabels)
}

// writeFamilies writes each family's samples of every GPU that has a value,
// under one header per family; a family no GPU has is left out.
func writeFamilies(w *bufio.Writer, fams []family, gpus []gpuState, labels func(*gpuState) string) {
	for _, f := range fams {
		wrote := false
		for i := range gpus {
			v := f.val(&gpus[i])
			if v == nil {
				continue
			}
			if !wrote {
				header(w, f.name, f.help, f.typ)
				wrote = true
			}
			fmt.Fprintf(w, "%s{%s} %s\n", f.name, labels(&gpus[i]), num(*v))
		}
	}
}

func header(w *bufio.Writer, name, help, typ string) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

// q quotes a label value as the Prometheus text format escapes it.
func q(s string) string { return `"` + labelEscaper.Replace(s) + `"` }

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func num(v float64) string {
	if math.IsNaN(v) {
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
