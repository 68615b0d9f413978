package collector_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/collector"
	"github.com/deepseed/deepseed/collector/nvml"
	"github.com/deepseed/deepseed/internal/promtest"
	"github.com/deepseed/deepseed/store/storetest"
)

// TestMetricsArePrometheusNative runs a collector over two GPUs whose
// NVML readings carry GPM values, forwarding to a real server, and scrapes
// its /metrics listener with Prometheus' own text parser: every family has
// its # HELP and # TYPE, and the dcgm-exporter profiling fields that
// NVIDIA's dashboard 12239 reads are there, as ratios, under
// dcgm-exporter's labels.
func TestMetricsArePrometheusNative(t *testing.T) {
	cp := mustCapture(t)
	gpm := map[string]float64{ // percent, as NVML's GPM gives them
		"DCGM_FI_PROF_SM_ACTIVE":          62.5,
		"DCGM_FI_PROF_SM_OCCUPANCY":       31.25,
		"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 48,
		"DCGM_FI_PROF_GR_ENGINE_ACTIVE":   91,
		"DCGM_FI_PROF_DRAM_ACTIVE":        37.5,
	}
	cp.Devices[0].GPM = true
	for i := range cp.Samples {
		r := &cp.Samples[i][0]
		v := func(name string) *float64 { x := gpm[name]; return &x }
		r.GPMSMActivePct, r.GPMSMOccupancy = v("DCGM_FI_PROF_SM_ACTIVE"), v("DCGM_FI_PROF_SM_OCCUPANCY")
		r.GPMTensorPct, r.GPMGraphicsPct = v("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), v("DCGM_FI_PROF_GR_ENGINE_ACTIVE")
		r.GPMDRAMBWPct = v("DCGM_FI_PROF_DRAM_ACTIVE")
	}
	srv := newIngestServer(t, storetest.NewStore(t))
	proc := t.TempDir()
	copyDir(t, "testdata/proc", proc)
	metricsAddr := freeAddr(t)
	c, stop := runCollector(t, collector.Config{
		Server: "http://" + srv.addr, SpoolDir: t.TempDir(), HostName: "gpu-node-7",
		HookListen: "127.0.0.1:0", MetricsListen: metricsAddr, DCGMCompat: true,
		Interval: 50 * time.Millisecond, BatchMaxAge: 50 * time.Millisecond,
		ProcRoot: proc, NVML: nvml.NewFake(cp, 2), Logger: slog.New(slog.DiscardHandler),
	})
	defer stop()
	if code, body := post(t, c, "POST", "/api/v1/ingest", "", `{"kind":"process","run_id":"prom","rank":0,"local_rank":0,"pid":422}`); code != 200 {
		t.Fatalf("announce: %d %s", code, body)
	}
	sendSteps(t, c, 0, 20)
	waitFor(t, "records forwarded", func() bool {
		n, _ := strconv.Atoi(metric(c, "deepseed_collector_records_forwarded_total"))
		return n >= 20
	})
	// The process families come with the first host sample after the
	// announce; on a busy machine forwarding can finish before it.
	waitFor(t, "a host sample of the announced process", func() bool {
		var buf bytes.Buffer
		c.WriteMetrics(&buf)
		return strings.Contains(buf.String(), "deepseed_host_process_cpu_seconds_total{")
	})

	// Run serves /metrics once it has started; the first scrape may come
	// before.
	url := "http://" + metricsAddr + "/metrics"
	waitFor(t, "the metrics listener", func() bool {
		conn, err := net.DialTimeout("tcp", metricsAddr, time.Second)
		if err != nil {
			return false
		}
		conn.Close()
		return true
	})
	_, fams := promtest.Scrape(t, url)

	for _, name := range []string{
		"deepseed_collector_hook_records_received_total", "deepseed_collector_records_forwarded_total",
		"deepseed_collector_records_dropped_total", "deepseed_collector_queue_records", "deepseed_gpu_sampling_up",
		"deepseed_gpu_info", "deepseed_gpu_utilization_ratio", "deepseed_gpu_dram_active_ratio",
		"deepseed_host_memory_total_bytes", "deepseed_host_process_cpu_seconds_total",
		"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_FB_USED",
	} {
		if fams[name] == nil {
			t.Errorf("no %s family", name)
		}
	}
	if m := promtest.Find(fams, "deepseed_collector_records_forwarded_total", nil); m == nil || m.GetCounter().GetValue() < 20 {
		t.Errorf("records_forwarded_total = %v, want at least the 20 steps", m)
	}
	if m := promtest.Find(fams, "deepseed_gpu_gpm_supported", map[string]string{"gpu": "1"}); m == nil || m.GetGauge().GetValue() != 1 {
		t.Errorf("deepseed_gpu_gpm_supported{gpu=1} = %v, want 1", m)
	}
	info := cp.Devices[0]
	for name, pct := range gpm {
		mf := fams[name]
		if mf == nil {
			t.Errorf("no %s family", name)
			continue
		}
		if got := mf.GetType().String(); got != "GAUGE" {
			t.Errorf("%s is a %s, want a gauge as dcgm-exporter has it", name, got)
		}
		if n := len(mf.GetMetric()); n != 2 {
			t.Errorf("%s has %d series, want one per GPU", name, n)
		}
		for gpu := 0; gpu < 2; gpu++ {
			uuid := info.UUID
			if gpu > 0 {
				uuid = fmt.Sprintf("%s-%d", info.UUID, gpu)
			}
			m := promtest.Find(fams, name, map[string]string{
				"gpu": strconv.Itoa(gpu), "UUID": uuid, "Hostname": "gpu-node-7",
				"modelName": info.Name, "device": "nvidia" + strconv.Itoa(gpu),
			})
			if m == nil {
				t.Errorf("%s: no series for GPU %d with dcgm-exporter's labels", name, gpu)
				continue
			}
			if got, want := m.GetGauge().GetValue(), pct/100; math.Abs(got-want) > 1e-12 {
				t.Errorf("%s{gpu=%d} = %v, want the ratio %v", name, gpu, got, want)
			}
		}
	}
}
