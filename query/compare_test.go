package query_test

import (
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// hostRec is a host sample of host at t with the given CPU utilisation.
func hostRec(host string, t time.Time, cpu float64) api.Record {
	return api.Record{Host: &api.Host{Kind: "host", Time: api.T(t), Host: host, CPUUtilPct: api.F(cpu)}}
}

// gpuRec is a GPU sample of host's GPU gpu, attributed to run's rank.
func gpuRec(run, host string, gpu int, t time.Time, util, memBytes float64) api.Record {
	return api.Record{GPU: &api.GPU{Kind: "gpu", Time: api.T(t), Host: host, GPU: api.Ptr(gpu), RunID: run, Rank: api.Ptr(gpu),
		UtilPct: api.F(util), MemUsedBytes: api.F(memBytes)}}
}

func mean(vs ...float64) float64 {
	s := 0.0
	for _, v := range vs {
		s += v
	}
	return s / float64(len(vs))
}

// A run of about a second: no 1 Hz sample falls between its first and
// last steady step, yet its row keeps GPU memory, GPU and CPU
// utilisation from the samples just around it, and says so.
func TestCompareShortRunKeepsFigures(t *testing.T) {
	e := newEnv(t)
	recs := []api.Record{runRec("short", &api.RunMeta{WorldSize: api.Ptr(2)})}
	recs[0].Run.SweepID = "s"
	start := t0.Add(200 * time.Millisecond)
	for rank := 0; rank < 2; rank++ {
		for i := int64(1); i <= 30; i++ {
			r := stepRec("short", rank, i, func(s *api.Step) {
				s.StepMS = api.F(32)
				s.GPUMemPeakGB = api.F(6.4 + 0.05*float64(rank)) // the allocator's peak
				s.GPUMemResvGB = api.F(7.0)
			})
			r.Step.Time = api.T(start.Add(time.Duration(i) * 32 * time.Millisecond))
			recs = append(recs, r)
		}
	}
	// Collector samples at whole seconds: the steps run from 0.232 s to
	// 1.16 s, so none falls inside. GPU samples of the run before and after.
	recs = append(recs,
		gpuRec("short", "n1", 0, t0, 30, 9.2e9), gpuRec("short", "n2", 1, t0, 35, 9.4e9),
		gpuRec("short", "n1", 0, t0.Add(2*time.Second), 28, 9.3e9), gpuRec("short", "n2", 1, t0.Add(2*time.Second), 37, 9.5e9),
		// n1 and n2 are the run's nodes; n3 runs something else.
		hostRec("n1", t0, 40), hostRec("n1", t0.Add(2*time.Second), 44), hostRec("n1", t0.Add(9*time.Second), 48),
		hostRec("n2", t0.Add(-3*time.Second), 60), hostRec("n2", t0.Add(2*time.Second), 50),
		hostRec("n1", t0.Add(30*time.Second), 99), // beyond the near window
		hostRec("n3", t0.Add(time.Second), 5))
	e.write(recs...)

	var res api.CompareResponse
	e.get("/compare?run=short", 200, &res)
	if len(res.Rows) != 1 {
		t.Fatalf("rows: %+v", res.Rows)
	}
	r := res.Rows[0]
	check := func(name string, got *api.Float, want float64) {
		t.Helper()
		if got == nil || !near(float64(*got), want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("step_time_s", r.StepTimeS, 0.032)
	check("gpu_mem_mean_mb", r.GPUMemMeanMB, mean(9200, 9400, 9300, 9500))
	check("gpu_mem_peak_mb", r.GPUMemPeakMB, 9500)
	check("gpu_mem_alloc_peak_mb", r.GPUMemAllocPeakMB, 6450)
	check("gpu_util_pct", r.GPUUtilPct, mean(30, 35, 28, 37))
	// The mean of each node's mean: n1 (40, 44, 48), n2 (60, 50).
	check("cpu_util_pct", r.CPUUtilPct, mean(mean(40, 44, 48), mean(60, 50)))
	for k, want := range map[string]string{"gpu_mem_mean_mb": api.SourceGPUSamplesRun, "gpu_util_pct": api.SourceGPUSamplesRun,
		"cpu_util_pct": api.SourceHostSamplesNear, "step_time_s": api.SourceSteps, "gpu_mem_alloc_peak_mb": api.SourceSteps} {
		if r.Sources[k] != want {
			t.Errorf("source of %s = %q, want %q", k, r.Sources[k], want)
		}
	}
	for _, want := range []string{"no GPU sample fell in the steady state", "4 samples outside it", "from 5 host samples"} {
		if !strings.Contains(r.Note, want) {
			t.Errorf("note %q lacks %q", r.Note, want)
		}
	}
}

// Without any GPU sample, GPU memory falls back to the hook's reserved
// peak and the row says GPU utilisation is unknown; host CPU comes from
// the host samples inside the steady state only, on the run's node.
func TestCompareWithoutGPUSamples(t *testing.T) {
	e := newEnv(t)
	// nogpu's node is known from its process in m1's host samples,
	// metahost's from its meta only.
	recs := []api.Record{runRec("nogpu", nil), runRec("metahost", &api.RunMeta{Host: "m2"})}
	for i := int64(0); i < 60; i++ {
		for _, id := range []string{"nogpu", "metahost"} {
			recs = append(recs, stepRec(id, 0, i, func(s *api.Step) {
				s.StepMS = api.F(1000)
				s.GPUMemPeakGB = api.F(3 + float64(i%3)*0.1)
				s.GPUMemResvGB = api.F(4.5)
			}))
		}
	}
	var inside []float64
	for i := -5; i < 70; i += 5 {
		h := hostRec("m1", t0.Add(time.Duration(i)*time.Second), float64(20+i))
		h.Host.Processes = []api.HostProcess{{PID: 7, RunID: "nogpu", CPUPct: api.F(100)}}
		recs = append(recs, h, hostRec("m2", t0.Add(time.Duration(i)*time.Second), 90))
	}
	e.write(recs...)
	var bd api.Breakdown
	e.get("/runs/nogpu/breakdown", 200, &bd)
	for i := -5; i < 70; i += 5 {
		if int64(i) >= bd.FromStep && int64(i) <= bd.ToStep {
			inside = append(inside, float64(20+i))
		}
	}

	var res api.CompareResponse
	e.get("/compare?run=nogpu", 200, &res)
	r := res.Rows[0]
	if r.GPUMemMeanMB == nil || !near(float64(*r.GPUMemMeanMB), 4500) || r.Sources["gpu_mem_mean_mb"] != api.SourceHookReserved {
		t.Errorf("gpu memory %v from %q", r.GPUMemMeanMB, r.Sources["gpu_mem_mean_mb"])
	}
	if r.GPUMemAllocPeakMB == nil || !near(float64(*r.GPUMemAllocPeakMB), 3200) {
		t.Errorf("allocator peak %v", r.GPUMemAllocPeakMB)
	}
	if r.GPUUtilPct != nil || !strings.Contains(r.Note, "no GPU utilisation") || !strings.Contains(r.Note, "allocator peak (reserved)") {
		t.Errorf("gpu util %v, note %q", r.GPUUtilPct, r.Note)
	}
	if len(inside) == 0 || r.CPUUtilPct == nil || !near(float64(*r.CPUUtilPct), mean(inside...)) || r.Sources["cpu_util_pct"] != api.SourceHostSamples {
		t.Errorf("cpu %v from %q, want %v of host samples", r.CPUUtilPct, r.Sources["cpu_util_pct"], mean(inside...))
	}
	e.get("/compare?run=metahost", 200, &res)
	if c := res.Rows[0].CPUUtilPct; c == nil || float64(*c) != 90 {
		t.Errorf("metahost cpu %v, want its meta host's 90", c)
	}
}

// best_eval_accuracy names the evaluations as its source, not the steps
// every other training figure comes from; a run without evaluations names
// no source for it.
func TestCompareBestEvalAccuracyComesFromEvals(t *testing.T) {
	e := newEnv(t)
	recs := []api.Record{runRec("with-evals", nil), runRec("no-evals", nil)}
	for _, id := range []string{"with-evals", "no-evals"} {
		for i := int64(0); i < 40; i++ {
			recs = append(recs, stepRec(id, 0, i, func(s *api.Step) { s.StepMS = api.F(100); s.Loss = api.F(2) }))
		}
	}
	recs = append(recs,
		api.Record{Eval: &api.Eval{Kind: "eval", RunID: "with-evals", Step: api.Ptr(int64(20)), Time: api.T(t0), Accuracy: api.F(0.6)}},
		api.Record{Eval: &api.Eval{Kind: "eval", RunID: "with-evals", Step: api.Ptr(int64(39)), Time: api.T(t0), Accuracy: api.F(0.9)}})
	e.write(recs...)

	var res api.CompareResponse
	e.get("/compare?run=with-evals&run=no-evals", 200, &res)
	if len(res.Rows) != 2 {
		t.Fatalf("rows: %+v", res.Rows)
	}
	for _, r := range res.Rows {
		switch r.RunID {
		case "with-evals":
			if r.BestEvalAcc == nil || float64(*r.BestEvalAcc) != 0.9 || r.Sources["best_eval_accuracy"] != api.SourceEvals {
				t.Errorf("with-evals: best_eval_accuracy %v from %q, want 0.9 from %q", r.BestEvalAcc, r.Sources["best_eval_accuracy"], api.SourceEvals)
			}
		case "no-evals":
			if src, ok := r.Sources["best_eval_accuracy"]; ok || r.BestEvalAcc != nil {
				t.Errorf("no-evals: best_eval_accuracy %v from %q, want none", r.BestEvalAcc, src)
			}
		}
		if r.Sources["final_loss"] != api.SourceSteps {
			t.Errorf("%s: final_loss from %q, want %q", r.RunID, r.Sources["final_loss"], api.SourceSteps)
		}
	}
}
