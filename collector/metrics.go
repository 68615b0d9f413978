package collector

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/collector/nvml"
	"github.com/deepseed/deepseed/internal/exposition"
)

// collectorMetrics is the collector's own health, written with the GPU
// and host samples on /metrics.
type collectorMetrics struct {
	reg          *exposition.Registry
	received     *metrics.Counter
	forwarded    *metrics.Counter
	failed       *metrics.Counter
	droppedFull  *metrics.Counter // sampled records dropped for room under --spool-max-bytes
	droppedWrite *metrics.Counter // sampled records the spool could not write (disk full …)
	hookFull     *metrics.Counter // hook requests answered 503: the spool could not take them
	deadLettered *metrics.Counter
	sendErrors   *metrics.Counter
	hookRejected *metrics.Counter

	lastSend atomic.Int64 // Unix milliseconds of the last accepted batch
	gpuUp    atomic.Bool
	hostUp   atomic.Bool
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// newCollectorMetrics registers c's health families, in the order of the
// page; the gauges read c at each scrape.
func newCollectorMetrics(c *Collector) *collectorMetrics {
	r := exposition.NewRegistry()
	m := &collectorMetrics{reg: r}
	gauge := func(name, help string, v func() float64) {
		r.Func(name, help, "gauge", func() (float64, bool) { return v(), true })
	}
	m.received = r.Counter("deepseed_collector_hook_records_received_total", "Records the hook receiver took into the queue.")
	m.hookRejected = r.Counter("deepseed_collector_hook_requests_rejected_total", "Hook requests answered 4xx: bodies that could not be read or held an invalid record.")
	m.hookFull = r.Counter("deepseed_collector_hook_requests_deferred_total", "Hook requests answered 503 because the spool could not take them.")
	m.forwarded = r.Counter("deepseed_collector_records_forwarded_total", "Records the server acknowledged.")
	m.failed = r.Counter("deepseed_collector_records_failed_total", "Records in sends that failed; they stay in the spool and are sent again.")
	dropped := r.CounterVec("deepseed_collector_records_dropped_total", "Sampled records dropped: to make room under the spool's bound, or because the spool could not be written.", "reason")
	m.droppedFull, m.droppedWrite = dropped.With("spool_full"), dropped.With("write_failed")
	m.deadLettered = r.Counter("deepseed_collector_records_dead_lettered_total", "Records the server refused, written to the dead-letter file.")
	m.sendErrors = r.Counter("deepseed_collector_send_errors_total", "Sends to the server that failed.")
	gauge("deepseed_collector_queue_records", "Records waiting to be sent, in memory and in the spool.", func() float64 { return float64(c.queueDepth()) })
	gauge("deepseed_collector_spool_bytes", "Bytes of the batches in the spool.", func() float64 { return float64(c.spool.size()) })
	r.Writer(func(w io.Writer) error {
		const name = "deepseed_collector_spool_records"
		exposition.Header(w, name, "Records in the spool waiting for the server: the hook's, acknowledged and never dropped, and the collector's own samples, dropped first when the spool is full.", "gauge")
		n, s := c.spool.counts()
		exposition.Sample(w, name, `source="hook"`, float64(n-s))
		exposition.Sample(w, name, `source="sampled"`, float64(s))
		return nil
	})
	gauge("deepseed_collector_forward_lag_seconds", "Age of the oldest hook record acknowledged and not yet stored by the server (0: none waiting).", c.forwardLag)
	gauge("deepseed_collector_spool_batches", "Batches in the spool.", func() float64 { return float64(c.spool.len()) })
	gauge("deepseed_collector_last_send_timestamp_seconds", "Unix time of the last batch the server acknowledged (0: none yet).", func() float64 { return float64(m.lastSend.Load()) / 1000 })
	gauge("deepseed_gpu_sampling_up", "1 while the last GPU sample through NVML succeeded.", func() float64 { return b2f(m.gpuUp.Load()) })
	gauge("deepseed_host_sampling_up", "1 while the last host sample succeeded.", func() float64 { return b2f(m.hostUp.Load()) })
	gauge("deepseed_gpu_count", "GPUs (and MIG instances) NVML shows.", func() float64 { return float64(len(c.gpu.devs)) })
	return m
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
	_ = c.m.reg.Write(bw) // the collector's families return no error
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
		w.Header().Set("Content-Type", exposition.ContentType)
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

func f64p(p *float64, scale float64) *float64 {
	if p == nil {
		return nil
	}
	return ptrF(*p * scale)
}

// gpuFamilies are the /metrics families of the GPU values in the metric
// table, in its order; dcgmFamilies their dcgm-exporter counterparts,
// which NVIDIA's Grafana dashboard 12239 and common alerts read, in that
// exporter's units (MiB for frame buffer, MHz, watts, millijoules,
// percent for DEV utilisation and ratios for the PROF fields) and order.
var gpuFamilies, dcgmFamilies = tableFamilies()

func tableFamilies() (own, dcgm []family) {
	var dcgmFrom []*api.GPUMetric
	for i := range api.GPUMetrics {
		m := &api.GPUMetrics[i]
		if m.Prom != nil {
			own = append(own, tableFamily(m, m.Prom))
		}
		if m.DCGM != nil {
			dcgmFrom = append(dcgmFrom, m)
		}
	}
	slices.SortFunc(dcgmFrom, func(a, b *api.GPUMetric) int { return a.DCGM.Seq - b.DCGM.Seq })
	for _, m := range dcgmFrom {
		dcgm = append(dcgm, tableFamily(m, m.DCGM))
	}
	return own, dcgm
}

// tableFamily reads a table metric from NVML's reading (or the device's
// facts), or when NVML gives it not as such from the record.
func tableFamily(m *api.GPUMetric, e *api.GPUExport) family {
	if m.NVML == "" {
		return family{e.Name, e.Help, e.Type, func(s *gpuState) *float64 {
			if v, ok := m.Value(&s.rec).(float64); ok {
				return ptrF(v * e.Scale)
			}
			return nil
		}}
	}
	get := nvml.Getter(m.NVML)
	return family{e.Name, e.Help, e.Type, func(s *gpuState) *float64 {
		if get == nil {
			return nil
		}
		if v, ok := get(&s.info, &s.r); ok {
			return ptrF(v * e.Scale)
		}
		return nil
	}}
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
		exposition.Header(w, "deepseed_gpu_info", "Static facts of each GPU; always 1.", "gauge")
		for i := range gpus {
			s := &gpus[i]
			exposition.Sample(w, "deepseed_gpu_info", fmt.Sprintf("%s,name=%s,pci_bus_id=%s", c.gpuLabels(s), q(s.info.Name), q(s.info.PCIBusID)), 1)
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
			exposition.Header(w, "deepseed_gpu_run", "The run and rank a GPU's samples are attributed to; always 1.", "gauge")
			wrote = true
		}
		exposition.Sample(w, "deepseed_gpu_run", fmt.Sprintf("%s,run_id=%s,rank=\"%d\"", c.gpuLabels(s), q(s.rec.RunID), *s.rec.Rank), 1)
	}
	wrote = false
	for i := range gpus {
		s := &gpus[i]
		for _, p := range s.procs {
			if p.memBytes == nil {
				continue
			}
			if !wrote {
				exposition.Header(w, "deepseed_gpu_process_memory_bytes", "Device memory used by each compute process.", "gauge")
				wrote = true
			}
			runID, rank := "", ""
			if p.who != nil {
				runID, rank = p.who.RunID, strconv.Itoa(p.who.Rank)
			}
			exposition.Sample(w, "deepseed_gpu_process_memory_bytes", fmt.Sprintf("%s,pid=\"%d\",run_id=%s,rank=%s", c.gpuLabels(s), p.pid, q(runID), q(rank)), *p.memBytes)
		}
	}
}

func (c *Collector) writeHost(w *bufio.Writer, h *hostReading) {
	hl := "host=" + q(c.cfg.HostName)
	one := func(name, help, typ string, v *float64) {
		if v == nil {
			return
		}
		exposition.Header(w, name, help, typ)
		exposition.Sample(w, name, hl, *v)
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
				exposition.Header(w, f.name, f.help, f.typ)
				wrote = true
			}
			exposition.Sample(w, f.name, procLabels(p), *v)
		}
	}
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
				exposition.Header(w, f.name, f.help, f.typ)
				wrote = true
			}
			exposition.Sample(w, f.name, labels(&gpus[i]), *v)
		}
	}
}

// q quotes a label value.
func q(s string) string { return exposition.Quote(s) }
