package collector_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/deepseed/deepseed/collector"
	"github.com/deepseed/deepseed/collector/nvml"
)

// BenchmarkWriteMetrics is the cost of one scrape of /metrics on a node
// of eight GPUs, dcgm-exporter names included.
func BenchmarkWriteMetrics(b *testing.B) {
	proc := b.TempDir()
	copyDir(b, "testdata/proc", proc)
	clock := &fakeClock{t: time.Date(2026, 11, 22, 6, 17, 1, 0, time.UTC)}
	c, err := collector.New(collector.Config{
		SpoolDir: b.TempDir(), HostName: "gpu-node-1", DCGMCompat: true,
		ProcRoot: proc, NVML: nvml.NewFake(mustCapture(b), 8), Now: clock.Now, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	c.SampleOnce()
	b.ReportAllocs()
	for b.Loop() {
		c.WriteMetrics(io.Discard)
	}
}
