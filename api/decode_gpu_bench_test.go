//go:build unix

package api_test

import (
	"fmt"
	"syscall"
	"testing"

	"github.com/deepseed/deepseed/api"
)

// BenchmarkDecodeGPUBatch decodes 800 GPU samples, as a node's collector
// sends them: records the fast path leaves to the general one.
func BenchmarkDecodeGPUBatch(b *testing.B) {
	var body []byte
	for i := range 800 {
		body = fmt.Appendf(body, `{"kind":"gpu","time":%d.5,"host":"node-%d","gpu":%d,"uuid":"GPU-%08x","name":"NVIDIA H100 80GB HBM3",`+
			`"run_id":"bench-run","util_pct":%d,"mem_used_bytes":%d,"mem_total_bytes":85899345920,"power_w":612.5,"temp_c":67,`+
			`"sm_clock_mhz":1980,"mem_clock_mhz":2619,"pcie_tx_bytes":123456789,"pcie_rx_bytes":987654321}`+"\n",
			1735689600+i/8, i%16, i%8, i, i%100, int64(i)*1<<30)
	}
	if _, err := api.DecodeBatch(body); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	cpu0 := cpuTime()
	for b.Loop() {
		if _, err := api.DecodeBatch(body); err != nil {
			b.Fatal(err)
		}
	}
	// The process's CPU time, which a busy machine inflates far less than
	// the wall clock ns/op counts.
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N)/800, "cpu-ns/record")
	b.ReportMetric(800*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// cpuTime is the user and system CPU time of this process, in ns.
func cpuTime() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}
