package collector_test

import (
	"context"
	"log/slog"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/deepseed/deepseed/collector"
	"github.com/deepseed/deepseed/collector/nvml"
)

// twoGPUCapture is tick 30 of the H100 capture, where PID 422 holds the
// GPU, shown as two GPUs of which only the first has the process: 100
// ticks without the process, then 300 with it, positioned at the first of
// those. It carries the call costs of the capture taken with timing on
// (not spent: the tests count calls).
func twoGPUCapture(t *testing.T) *nvml.Fake {
	t.Helper()
	cp := mustCapture(t)
	costs, err := nvml.LoadCapture("testdata/capture-h100-costs.json")
	if err != nil {
		t.Fatal(err)
	}
	second := cp.Devices[0]
	second.Index, second.Minor, second.UUID = 1, 1, second.UUID+"-1"
	cp.Devices = append(cp.Devices, second)
	held := cp.Samples[30][0]
	idle := held
	idle.Processes = nil
	cp.Samples = nil
	for k := 0; k < 400; k++ {
		if k < 100 {
			cp.Samples = append(cp.Samples, []nvml.Reading{idle, idle})
		} else {
			cp.Samples = append(cp.Samples, []nvml.Reading{held, idle})
		}
	}
	cp.Costs = costs.Costs
	f := nvml.NewFake(cp, 0)
	f.NoCosts = true
	f.Seek(100)
	return f
}

func announce(t *testing.T, c *collector.Collector, pid int) {
	t.Helper()
	body := `{"kind":"process","run_id":"fast","rank":0,"local_rank":0,"pid":` + strconv.Itoa(pid) + `}`
	if code, msg := post(t, c, "POST", "/api/v1/ingest", "", body); code != 200 {
		t.Fatalf("announce: %d %s", code, msg)
	}
}

// TestAdaptiveSampling: the GPU that an announced training process holds
// is sampled at the fast interval, the other at the base one; records and
// /metrics say which; the process list is read once per process interval,
// GPM once per GPM interval on the held GPU and with the counters on the
// other, the costly counters once per counter interval and the energy
// counter once per energy interval, both staggered.
func TestAdaptiveSampling(t *testing.T) {
	fake := twoGPUCapture(t)
	t0 := time.Date(2026, 11, 22, 6, 17, 1, 0, time.UTC)
	now := t0
	c, err := collector.New(collector.Config{
		SpoolDir: t.TempDir(), HostName: "n", ProcRoot: "testdata/proc", NVML: fake,
		Interval: time.Second, FastInterval: 100 * time.Millisecond, CounterInterval: 10 * time.Second,
		EnergyInterval: 20 * time.Second, GPMInterval: 5 * time.Second, ProcessInterval: 5 * time.Second,
		Now: func() time.Time { return now }, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	announce(t, c, 422)
	end := t0.Add(25 * time.Second)
	wakes := 0
	for now.Before(end) {
		next := collector.SampleDue(c, now)
		if !next.After(now) {
			t.Fatalf("next sample %v is not after now %v", next, now)
		}
		now = next
		wakes++
	}
	// 25 s: GPU 0 turns fast at its first process read (t0) and stays.
	util0, util1 := fake.Calls(0)["utilization"], fake.Calls(1)["utilization"]
	if util0 < 240 || util0 > 251 {
		t.Errorf("held GPU read %d times in 25 s, want about 250 (100 ms)", util0)
	}
	if util1 != 25 {
		t.Errorf("idle GPU read %d times in 25 s, want 25 (1 s)", util1)
	}
	// Temperatures and clocks at base ticks only, on both.
	for i := 0; i < 2; i++ {
		if n := fake.Calls(i)["temperature"]; n != 25 {
			t.Errorf("GPU %d: temperature read %d times in 25 s, want 25 (base ticks only)", i, n)
		}
		if n := fake.Calls(i)["clock_sm"]; n != 25 {
			t.Errorf("GPU %d: SM clock read %d times in 25 s, want 25 (base ticks only)", i, n)
		}
	}
	if wakes > util0+1 {
		t.Errorf("%d wake-ups for %d fast samples: the loop wakes when nothing is due", wakes, util0)
	}
	for i := 0; i < 2; i++ {
		calls := fake.Calls(i)
		// t0, 5, 10, 15 and 20 s.
		if n := calls["compute_processes"]; n != 5 {
			t.Errorf("GPU %d: processes read %d times, want once in 5 s (5)", i, n)
		}
		// Counters at t0 and then every 10 s, the second GPU's half an
		// interval later: t0, 10 s, 20 s and t0, 15 s; energy every 20 s,
		// staggered likewise: t0, 20 s and t0 (30 s is past the end).
		want := map[int]int{0: 3, 1: 2}[i]
		if n := calls["total_energy"]; n != map[int]int{0: 2, 1: 1}[i] {
			t.Errorf("GPU %d: energy read %d times in 25 s, want %d", i, n, map[int]int{0: 2, 1: 1}[i])
		}
		// GPM every 5 s on the held GPU (t0 … 20 s), with the counters on
		// the idle one.
		if n := calls["gpm_sample"]; n != map[int]int{0: 5, 1: 2}[i] {
			t.Errorf("GPU %d: GPM read %d times in 25 s, want %d", i, n, map[int]int{0: 5, 1: 2}[i])
		}
		if n := calls["pcie_throughput_tx"]; n != want {
			t.Errorf("GPU %d: PCIe throughput read %d times, want %d", i, n, want)
		}
		if n := calls["ecc_corrected"]; n != want {
			t.Errorf("GPU %d: ECC read %d times, want %d", i, n, want)
		}
	}
	r0, r1 := collector.LastGPURecord(c, 0), collector.LastGPURecord(c, 1)
	if r0.SampleIntervalS == nil || float64(*r0.SampleIntervalS) != 0.1 || r0.RunID != "fast" {
		t.Errorf("held GPU's record: interval %v run %q, want 0.1 and fast", r0.SampleIntervalS, r0.RunID)
	}
	if r1.SampleIntervalS == nil || float64(*r1.SampleIntervalS) != 1 || r1.RunID != "" {
		t.Errorf("idle GPU's record: interval %v run %q, want 1 and none", r1.SampleIntervalS, r1.RunID)
	}
	// Counters read long ago still stand in every record.
	if r0.EnergyJ == nil || r0.ECCCorrected == nil || r0.PCIeTxBps == nil {
		t.Errorf("held GPU's record lost its counters between reads: %+v", r0)
	}
	if v := metric(c, `deepseed_gpu_sample_interval_seconds{host="n",gpu="0",uuid="`+r0.UUID+`"}`); v != "0.1" {
		t.Errorf("/metrics: held GPU's interval %q, want 0.1", v)
	}
	if v := metric(c, `deepseed_gpu_sample_interval_seconds{host="n",gpu="1",uuid="`+r1.UUID+`"}`); v != "1" {
		t.Errorf("/metrics: idle GPU's interval %q, want 1", v)
	}
}

// TestAdaptiveSamplingOff: with the fast interval off, a held GPU is
// sampled at the base interval like any other.
func TestAdaptiveSamplingOff(t *testing.T) {
	fake := twoGPUCapture(t)
	now := time.Date(2026, 11, 22, 6, 17, 1, 0, time.UTC)
	c, err := collector.New(collector.Config{
		SpoolDir: t.TempDir(), HostName: "n", ProcRoot: "testdata/proc", NVML: fake,
		Interval: time.Second, FastInterval: -1, Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	announce(t, c, 422)
	for k := 0; k < 5; k++ {
		next := collector.SampleDue(c, now)
		if got := next.Sub(now); got != time.Second {
			t.Fatalf("next sample in %v, want 1s", got)
		}
		now = next
	}
	if n := fake.Calls(0)["utilization"]; n != 5 {
		t.Errorf("held GPU read %d times in 5 ticks, want 5", n)
	}
}

// TestAdaptiveSamplingRun runs the collector's own loop on the wall clock:
// a GPU that a training process holds gets samples at the fast interval,
// and once the process leaves the GPU, at the base one again. What it
// compares is the reads of the held GPU against the idle one's over the
// same stretch, each stretch as long as the idle GPU's reads make it, so
// that a loaded machine slowing both does not decide it.
func TestAdaptiveSamplingRun(t *testing.T) {
	fake := twoGPUCapture(t)
	c, err := collector.New(collector.Config{
		SpoolDir: t.TempDir(), HostName: "n", ProcRoot: "testdata/proc", NVML: fake, HookListen: "127.0.0.1:0",
		Interval: 200 * time.Millisecond, FastInterval: 20 * time.Millisecond, ProcessInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	announce(t, c, 422)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	reads := func() (held, idle int) {
		return fake.Calls(0)["utilization"], fake.Calls(1)["utilization"]
	}
	// waitIdle waits until the idle GPU has been read n times more, and
	// returns what both GPUs were read meanwhile.
	waitIdle := func(n int) (held, idle int) {
		h0, i0 := reads()
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
			h, i := reads()
			if i-i0 >= n {
				return h - h0, i - i0
			}
			if time.Now().After(deadline) {
				t.Fatalf("the idle GPU was read %d times in two minutes", i-i0)
			}
		}
	}
	held, idle := waitIdle(5)
	// Back to the ticks without the process: the GPU returns to the base
	// interval at its next process read, which comes within a base tick.
	fake.Seek(0)
	waitIdle(2)
	after, afterIdle := waitIdle(5)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if held < 3*idle {
		t.Errorf("at 20 ms / 200 ms: held GPU read %d times while the idle one was read %d (want about ten times as often)", held, idle)
	}
	if after > 2*afterIdle {
		t.Errorf("after the process left, the GPU was read %d times while the idle one was read %d, want about as often", after, afterIdle)
	}
}

// TestAnnounceReadsProcesses: the process lists are read every process
// interval, but a training process announced in between has them read at
// the next sample, so that its GPU turns fast at once rather than up to a
// process interval later.
func TestAnnounceReadsProcesses(t *testing.T) {
	fake := twoGPUCapture(t)
	t0 := time.Date(2026, 11, 22, 6, 17, 1, 0, time.UTC)
	now := t0
	c, err := collector.New(collector.Config{
		SpoolDir: t.TempDir(), HostName: "n", ProcRoot: "testdata/proc", NVML: fake,
		Interval: time.Second, FastInterval: 100 * time.Millisecond, ProcessInterval: 10 * time.Second,
		Now: func() time.Time { return now }, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	step := func(until time.Time) {
		for now.Before(until) {
			now = collector.SampleDue(c, now)
		}
	}
	step(t0.Add(3 * time.Second))
	if n := fake.Calls(0)["compute_processes"]; n != 1 {
		t.Fatalf("processes read %d times in 3 s, want once (at the start)", n)
	}
	if iv := collector.LastGPURecord(c, 0).SampleIntervalS; iv == nil || float64(*iv) != 1 {
		t.Fatalf("GPU 0 before the announcement: interval %v, want 1", iv)
	}
	announce(t, c, 422)
	step(t0.Add(4*time.Second + 500*time.Millisecond))
	for i := 0; i < 2; i++ {
		if n := fake.Calls(i)["compute_processes"]; n != 2 {
			t.Errorf("GPU %d: processes read %d times, want twice (the start, and after the announcement)", i, n)
		}
	}
	r0 := collector.LastGPURecord(c, 0)
	if r0.SampleIntervalS == nil || float64(*r0.SampleIntervalS) != 0.1 || r0.RunID != "fast" {
		t.Errorf("GPU 0 after the announcement: interval %v run %q, want 0.1 and fast", r0.SampleIntervalS, r0.RunID)
	}
	// Re-announcing the same process changes nothing: no extra reads.
	announce(t, c, 422)
	step(t0.Add(6 * time.Second))
	if n := fake.Calls(1)["compute_processes"]; n != 2 {
		t.Errorf("GPU 1: processes read %d times after the same announcement again, want 2", n)
	}
}

// TestEnergyBetweenCounterReads replays the H100 capture (idle, then a
// matmul loop at 700 W, then idle, one reading a second, the energy
// counter in every one) with the energy counter read every 30 s only: the
// energy each record carries between reads, the counter plus the sampled
// power added up, stays close to what the counter said at that tick,
// never goes down, and is the counter itself where it was read.
func TestEnergyBetweenCounterReads(t *testing.T) {
	cp := mustCapture(t)
	costs, err := nvml.LoadCapture("testdata/capture-h100-costs.json")
	if err != nil {
		t.Fatal(err)
	}
	cp.Costs = costs.Costs
	fake := nvml.NewFake(cp, 1)
	fake.NoCosts = true
	now := time.UnixMilli(cp.Samples[0][0].TimeUnixMilli).UTC()
	c, err := collector.New(collector.Config{
		SpoolDir: t.TempDir(), HostName: "n", ProcRoot: "testdata/proc", NVML: fake,
		Interval: time.Second, FastInterval: -1, CounterInterval: 30 * time.Second, EnergyInterval: 30 * time.Second,
		Now: func() time.Time { return now }, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	// The step of the load: highest power less lowest, in W.
	lo, hi := math.Inf(1), 0.0
	for _, row := range cp.Samples {
		p := float64(*row[0].PowerMilliW) * 1e-3
		lo, hi = min(lo, p), max(hi, p)
	}
	step := hi - lo
	prev := 0.0
	var worst float64
	for k := range cp.Samples {
		// Each tick at the time the capture's reading was taken.
		now = time.UnixMilli(cp.Samples[k][0].TimeUnixMilli).UTC()
		c.SampleOnce()
		r := collector.LastGPURecord(c, 0)
		if r.EnergyJ == nil {
			t.Fatalf("tick %d: no energy", k)
		}
		got := float64(*r.EnergyJ)
		counter := float64(*cp.Samples[k][0].EnergyMilliJ) * 1e-3
		read := k%30 == 0
		if got < prev {
			t.Errorf("tick %d: energy went down from %.3f to %.3f J", k, prev, got)
		}
		if read && got != max(counter, prev) {
			t.Errorf("tick %d: energy %.3f J where the counter was read (%.3f J)", k, got, counter)
		}
		last := float64(*cp.Samples[k-k%30][0].EnergyMilliJ) * 1e-3
		// Off by a fraction of the energy since the last read, plus what a
		// one-second power average misses at a step in the load: a tenth
		// of a second of the step.
		if off, allowed := math.Abs(got-counter), 0.005*(counter-last)+0.1*step; off > allowed {
			t.Errorf("tick %d: energy %.1f J, counter %.1f J: off by %.1f J, want at most %.1f", k, got, counter, off, allowed)
		}
		worst = max(worst, math.Abs(got-counter))
		prev = got
	}
	if n := fake.Calls(0)["total_energy"]; n != 3 {
		t.Errorf("energy counter read %d times in %d ticks, want 3 (every 30 s)", n, len(cp.Samples))
	}
	t.Logf("energy between counter reads within %.1f J of the counter (load step %.0f W)", worst, step)
	r := collector.LastGPURecord(c, 0)
	if v := metric(c, `deepseed_gpu_energy_joules_total{host="n",gpu="0",uuid="`+r.UUID+`"}`); v != strconv.FormatFloat(prev, 'g', -1, 64) {
		t.Errorf("/metrics energy %s, record %v: want the same", v, prev)
	}
}
