package store_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// The per-minute sums that ingest keeps give the figures of every sample
// in a window, whether it lies inside one minute, cuts minutes at both
// ends or covers the whole run, and a retried batch adds nothing to them.
func TestGPUAndHostFiguresFromMinuteSums(t *testing.T) {
	s := storetest.NewStore(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 10, 0, 17, 0, time.UTC)
	var lines []string
	for i := 0; i < 200; i++ { // every 1.5 s over five minutes, two hosts
		at := t0.Add(time.Duration(i) * 1500 * time.Millisecond).Format(time.RFC3339Nano)
		for h := 0; h < 2; h++ {
			lines = append(lines, fmt.Sprintf(`{"kind":"gpu","time":%q,"host":"h%d","gpu":0,"run_id":"r","rank":%d,"util_pct":%d,"mem_used_bytes":%d,"mem_total_bytes":80e9}`,
				at, h, h, (i*7+h*13)%100, 1e9+int64(i%37)*1e8+int64(h)*5e8))
			lines = append(lines, fmt.Sprintf(`{"kind":"host","time":%q,"host":"h%d","cpu_util_pct":%d}`, at, h, (i*11+h*3)%100))
		}
	}
	mustWrite(t, s, lines...)
	mustWrite(t, s, lines[:100]...) // a retry: nothing new

	windows := [][2]time.Time{
		{}, // the whole run
		{t0.Add(5 * time.Second), t0.Add(40 * time.Second)},                                        // inside one minute
		{t0.Add(20 * time.Second), t0.Add(250 * time.Second)},                                      // cuts minutes at both ends
		{t0.Truncate(time.Minute).Add(time.Minute), t0.Truncate(time.Minute).Add(3 * time.Minute)}, // whole minutes
	}
	for _, w := range windows {
		got, err := s.GPUSampleStats(ctx, "r", w[0], w[1])
		if err != nil {
			t.Fatal(err)
		}
		var want store.GPUSampleStats
		lo, hi := w[0], w[1]
		if lo.IsZero() {
			lo, hi = t0.Add(-time.Hour), t0.Add(time.Hour)
		}
		if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT max(mem_used_bytes), avg(mem_used_bytes), avg(util_pct), max(mem_total_bytes),
			count(mem_used_bytes), count(util_pct) FROM gpu_samples WHERE run_id = 'r' AND time >= $1 AND time <= $2`, lo, hi).
			Scan(&want.PeakMemBytes, &want.MeanMemBytes, &want.MeanUtil, &want.TotalMemBytes, &want.Samples, &want.UtilSamples); err != nil {
			t.Fatal(err)
		}
		if want.Samples == 0 || got.Samples != want.Samples || got.UtilSamples != want.UtilSamples ||
			!same(got.PeakMemBytes, want.PeakMemBytes) || !same(got.MeanMemBytes, want.MeanMemBytes) ||
			!same(got.MeanUtil, want.MeanUtil) || !same(got.TotalMemBytes, want.TotalMemBytes) {
			t.Errorf("window %v: %+v, want the samples' %+v", w, show(got), show(&want))
		}
		cpu, err := s.HostCPU(ctx, []string{"h0", "h1"}, lo, hi)
		if err != nil {
			t.Fatal(err)
		}
		var wantCPU float64
		var n int64
		if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT avg(c), sum(n)::bigint FROM (SELECT avg(cpu_util_pct) AS c, count(*) AS n FROM host_samples
			WHERE time >= $1 AND time <= $2 GROUP BY host) x`, lo, hi).Scan(&wantCPU, &n); err != nil {
			t.Fatal(err)
		}
		if cpu.MeanPct == nil || math.Abs(*cpu.MeanPct-wantCPU) > 1e-9 || cpu.Samples != n {
			t.Errorf("window %v: host CPU %v over %d samples, want %v over %d", w, cpu.MeanPct, cpu.Samples, wantCPU, n)
		}
	}
	hosts, err := s.RunHosts(ctx, "r", t0, t0.Add(time.Hour))
	if err != nil || fmt.Sprint(hosts) != "[h0 h1]" {
		t.Errorf("hosts of the run %v (%v), want [h0 h1]", hosts, err)
	}
}

func same(a, b *float64) bool {
	if a == nil || b == nil {
		return a == b
	}
	return math.Abs(*a-*b) <= 1e-9*math.Max(1, math.Abs(*b))
}

func show(g *store.GPUSampleStats) string {
	f := func(p *float64) string {
		if p == nil {
			return "nil"
		}
		return fmt.Sprint(*p)
	}
	return fmt.Sprintf("peak %s mean %s util %s total %s n %d/%d", f(g.PeakMemBytes), f(g.MeanMemBytes), f(g.MeanUtil),
		f(g.TotalMemBytes), g.Samples, g.UtilSamples)
}
