package collector

import (
	"testing"
	"time"

	"github.com/deepseed/deepseed/collector/nvml"
)

// BenchmarkGPURecord is the CPU a sample's record costs once NVML has
// been read: every value of the H100 capture turned into a gpu record.
func BenchmarkGPURecord(b *testing.B) {
	cp, err := nvml.LoadCapture("testdata/capture-h100.json")
	if err != nil {
		b.Fatal(err)
	}
	fake := nvml.NewFake(cp, 1)
	if err := fake.Init(); err != nil {
		b.Fatal(err)
	}
	g := newGPUSampler(fake, gpuIntervals{base: time.Second, counter: 30 * time.Second, energy: 5 * time.Minute, gpm: 5 * time.Second, procs: time.Second})
	r, err := fake.Read(0, nvml.FieldsAll|nvml.FieldsGPM)
	if err != nil {
		b.Fatal(err)
	}
	d := &g.dev[0]
	d.last = r
	now := time.Date(2026, 11, 22, 6, 17, 1, 0, time.UTC)
	b.ReportAllocs()
	for b.Loop() {
		rec := g.record(d, now, "bench", &g.devs[0], nvml.FieldsAll)
		if rec.PowerW == nil {
			b.Fatal("no power in the record")
		}
	}
}
