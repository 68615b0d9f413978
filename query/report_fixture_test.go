package query_test

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// The comparison report's tables, checked against real data: the fixture
// holds the records of nine DeepSpeed 0.14.4 runs of the report's
// configurations on two H100s (hook/gpu_check/report_check.py; see
// testdata/README.md), each rank watched by the hook through the node
// collector, which also sent the GPU samples (attributed to run and rank)
// and the host samples. The test loads them as the ingest server would,
// asks GET /api/v1/compare for the report's five tables, and recomputes
// every figure from the raw records, taking only the steady state's first
// step from the server (GET /runs/{id}/breakdown).

// relTol is the tolerance of figures recomputed from the raw records: the
// server and the test add the same numbers, in another order.
const relTol = 1e-6

func TestReportFixture(t *testing.T) {
	f, err := os.Open("testdata/report-h100x2.ndjson.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(zr)
	recs, err2 := api.DecodeBatch(body)
	if err != nil || err2 != nil {
		t.Fatal(err, err2)
	}
	ids, configs := map[string]string{}, map[string]json.RawMessage{}
	for _, r := range recs {
		if r.Run != nil {
			ids[r.Run.Name], configs[r.Run.RunID] = r.Run.RunID, r.Run.Config
		}
	}
	if len(ids) != 9 {
		t.Fatalf("fixture: %d records of %d runs, want the report's 9 runs", len(recs), len(ids))
	}

	e := newEnv(t)
	e.write(recs...)
	// The server's background refresher brings the rollups up to date
	// after ingest; the compare and breakdown reads would do it themselves.
	for _, id := range ids {
		if _, err := e.s.RefreshRollups(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	var all api.CompareResponse
	e.get("/compare?project=report-check", 200, &all)
	if len(all.Rows) != 9 {
		t.Fatalf("/compare?project=report-check: %d rows, want the 9 runs", len(all.Rows))
	}

	// compare asks for runs by name, in order, with an optional baseline,
	// and checks the rows come back in that order.
	compare := func(t *testing.T, baseline string, names ...string) []api.CompareRow {
		t.Helper()
		q := url.Values{}
		for _, n := range names {
			q.Add("run", ids[n])
		}
		if baseline != "" {
			q.Set("baseline", ids[baseline])
		}
		var res api.CompareResponse
		e.on(t).get("/compare?"+q.Encode(), 200, &res)
		for i, r := range res.Rows {
			if len(res.Rows) != len(names) || r.Name != names[i] || r.RunID != ids[names[i]] {
				t.Fatalf("row %d is %s (%s) of %d, want %s of %d in the table's order", i, r.Name, r.RunID, len(res.Rows), names[i], len(names))
			}
		}
		return res.Rows
	}
	// below checks a < b, saying what the user would read in the table.
	below := func(t *testing.T, a, b *api.Float, what string) {
		t.Helper()
		if a == nil || b == nil || !(*a < *b) {
			t.Errorf("%s, but the table reads %v against %v", what, a, b)
		}
	}

	tables := []struct {
		name  string
		runs  []string
		check func(t *testing.T, rows []api.CompareRow)
	}{
		{"zero_stage", []string{"z1-fp16", "z2-fp16", "z3-fp16"}, nil},
		{"precision", []string{"z1-fp32", "z1-fp16", "z1-bf16"}, func(t *testing.T, r []api.CompareRow) {
			below(t, r[1].GPUMemMeanMB, r[0].GPUMemMeanMB, "fp32 should hold more GPU memory (NVML, MB) than fp16 at ZeRO-1")
			below(t, r[2].StepTimeS, r[0].StepTimeS, "bf16 steps (s) should be faster than fp32's")
		}},
		{"pipeline_vs_data_parallel", []string{"pipe2-z1-fp16", "z1-fp16"}, func(t *testing.T, r []api.CompareRow) {
			below(t, r[0].GPUMemAllocPeakMB, r[1].GPUMemAllocPeakMB,
				"the 2-stage pipeline's allocator peak (MB) should be below data parallel's: each GPU holds half the model")
			if p := r[0]; p.Parallelism != "pipeline" || p.PipelineStages == nil || *p.PipelineStages != 2 || r[1].Parallelism != "data" {
				t.Errorf("pipeline row says %q with %v stages, data parallel row %q; want pipeline with 2, data", p.Parallelism, p.PipelineStages, r[1].Parallelism)
			}
			// Rank r ran stage r: every step record's metrics.pipeline_stage says so.
			for _, x := range recs {
				if s := x.Step; s != nil && s.RunID == ids["pipe2-z1-fp16"] {
					if v, ok := s.Metrics["pipeline_stage"]; !ok || float64(v) != float64(s.Rank) {
						t.Fatalf("rank %d step %d: pipeline_stage %v, want %d", s.Rank, *s.Step, s.Metrics["pipeline_stage"], s.Rank)
					}
				}
			}
		}},
		{"offload_vs_none", []string{"z3-fp16-offload", "z3-fp16"}, func(t *testing.T, r []api.CompareRow) {
			below(t, r[0].GPUUtilPct, r[1].GPUUtilPct, "CPU offload at ZeRO-3 should lower GPU utilisation (%)")
			below(t, r[1].CPUUtilPct, r[0].CPUUtilPct, "CPU offload at ZeRO-3 should raise host CPU utilisation (%)")
		}},
		{"410m_shape", []string{"410m-z3-offload-bf16", "410m-pipe2-z1-offload-bf16"}, nil},
	}
	for _, tb := range tables {
		t.Run(tb.name, func(t *testing.T) {
			rows := compare(t, "", tb.runs...)
			for _, r := range rows {
				checkReportRow(t, e.on(t), recs, r)
			}
			if tb.check != nil {
				tb.check(t, rows)
			}
		})
	}

	// Δ vs baseline: each row's change of step time against z1-fp16's.
	t.Run("precision_vs_fp16", func(t *testing.T) {
		rows := compare(t, "z1-fp16", "z1-fp32", "z1-fp16", "z1-bf16")
		base := float64(*rows[1].StepTimeS)
		for _, r := range rows {
			want := (float64(*r.StepTimeS) - base) / math.Abs(base) * 100
			if d := r.DeltaPct["step_time_s"]; d == nil || !near(float64(*d), want) {
				t.Errorf("%s: delta_pct.step_time_s = %v, want %v", r.Name, d, want)
			}
		}
	})

	// Every run's meta knows its total steps (the scheduler's
	// total_num_steps), and each rank recorded that many.
	t.Run("total_steps", func(t *testing.T) {
		for name, id := range ids {
			perRank := map[int]int64{}
			for _, r := range recs {
				if r.Step != nil && r.Step.RunID == id {
					perRank[r.Step.Rank]++
				}
			}
			var cfg struct {
				Scheduler struct {
					Params struct {
						TotalNumSteps int64 `json:"total_num_steps"`
					}
				}
			}
			_ = json.Unmarshal(configs[id], &cfg)
			var d api.RunDetail
			e.on(t).get("/runs/"+id, 200, &d)
			if n := d.TotalSteps; n == nil || len(perRank) != 2 || perRank[0] != *n || perRank[1] != *n || *n != cfg.Scheduler.Params.TotalNumSteps {
				t.Errorf("%s: total_steps %v, steps per rank %v, scheduler total_num_steps %d", name, n, perRank, cfg.Scheduler.Params.TotalNumSteps)
			}
		}
	})
}

// on is e reporting to t (a subtest).
func (e *env) on(t *testing.T) *env { c := *e; c.t = t; return &c }

// checkReportRow checks that every column of the report is filled from
// the steady window's own readings, and recomputes each from the raw
// records the way docs/compare.md and query/compare.go define it:
//
//   - steady steps: step >= from_step (the breakdown's, found on the
//     lowest rank), on every rank;
//   - window: [earliest time of a steady step, latest one], bounds
//     included, times as PostgreSQL keeps them (truncated to the
//     microsecond, as pgx encodes them);
//   - step_time_s: each rank's mean step_ms of its steady steps, averaged
//     over ranks, in seconds; steps_per_s likewise of each rank's steps
//     advanced per second between its first and last steady step;
//   - gpu_mem_alloc_peak_mb: the highest gpu_mem_peak_gb of any steady
//     step, × 1000 (on these runs also the highest of all their steps);
//   - gpu_mem_mean_mb, gpu_util_pct: the mean over every GPU sample
//     attributed to the run in the window (samples pooled, not per GPU);
//   - cpu_util_pct: each of the run's nodes' mean host cpu_util_pct in the
//     window, averaged over the nodes; the nodes are the hosts of its GPU
//     samples and those whose host samples within CompareNearWindow of the
//     window list one of its processes.
func checkReportRow(t *testing.T, e *env, recs []api.Record, r api.CompareRow) {
	t.Helper()
	var bd api.Breakdown
	e.get("/runs/"+r.RunID+"/breakdown", 200, &bd)
	us := func(x *api.Time) time.Time { return x.Time.Truncate(time.Microsecond) }

	type rankAgg struct {
		n, sumMS      float64
		first, last   int64
		firstT, lastT time.Time
	}
	ranks := map[int]*rankAgg{}
	alloc := math.Inf(-1)
	for _, x := range recs {
		s := x.Step
		if s == nil || s.RunID != r.RunID || *s.Step < bd.FromStep {
			continue
		}
		tt := us(s.Time)
		a := ranks[s.Rank]
		if a == nil {
			a = &rankAgg{first: *s.Step, last: *s.Step, firstT: tt, lastT: tt}
			ranks[s.Rank] = a
		}
		a.first, a.last = min(a.first, *s.Step), max(a.last, *s.Step)
		if tt.Before(a.firstT) {
			a.firstT = tt
		}
		if tt.After(a.lastT) {
			a.lastT = tt
		}
		if s.StepMS != nil {
			a.n++
			a.sumMS += float64(*s.StepMS)
		}
		if s.GPUMemPeakGB != nil {
			alloc = math.Max(alloc, float64(*s.GPUMemPeakGB))
		}
	}
	var from, to time.Time
	var stepS, sps float64
	for _, a := range ranks {
		if from.IsZero() || a.firstT.Before(from) {
			from = a.firstT
		}
		if a.lastT.After(to) {
			to = a.lastT
		}
		stepS += a.sumMS / a.n / 1000 / float64(len(ranks))
		sps += float64(a.last-a.first) / a.lastT.Sub(a.firstT).Seconds() / float64(len(ranks))
	}
	in := func(x *api.Time) bool { tt := us(x); return !tt.Before(from) && !tt.After(to) }

	var mem, util, nMem, nUtil float64
	nodes := map[string]bool{}
	for _, x := range recs {
		if g := x.GPU; g != nil && g.RunID == r.RunID {
			nodes[g.Host] = true
			if in(g.Time) && g.MemUsedBytes != nil {
				mem, nMem = mem+float64(*g.MemUsedBytes), nMem+1
			}
			if in(g.Time) && g.UtilPct != nil {
				util, nUtil = util+float64(*g.UtilPct), nUtil+1
			}
		}
		if h := x.Host; h != nil && !us(h.Time).Before(from.Add(-api.CompareNearWindow)) && !us(h.Time).After(to.Add(api.CompareNearWindow)) {
			for _, p := range h.Processes {
				if p.RunID == r.RunID {
					nodes[h.Host] = true
				}
			}
		}
	}
	cpuSum, cpuN := map[string]float64{}, map[string]float64{}
	for _, x := range recs {
		if h := x.Host; h != nil && nodes[h.Host] && h.CPUUtilPct != nil && in(h.Time) {
			cpuSum[h.Host] += float64(*h.CPUUtilPct)
			cpuN[h.Host]++
		}
	}
	var cpu float64
	for h := range cpuSum {
		cpu += cpuSum[h] / cpuN[h] / float64(len(cpuSum))
	}
	if len(ranks) != 2 || nMem == 0 || nUtil == 0 || len(cpuSum) == 0 {
		t.Fatalf("%s: steady window %v–%v from step %d: %d ranks, %v memory and %v utilisation samples, %d nodes with CPU samples",
			r.Name, from, to, bd.FromStep, len(ranks), nMem, nUtil, len(cpuSum))
	}

	for _, c := range []struct {
		col, src string
		got      *api.Float
		want     float64
		tol      float64
	}{
		{"gpu_mem_mean_mb", api.SourceGPUSamples, r.GPUMemMeanMB, mem / nMem / 1e6, relTol},
		{"gpu_mem_alloc_peak_mb", api.SourceSteps, r.GPUMemAllocPeakMB, alloc * 1000, 1e-9},
		{"gpu_util_pct", api.SourceGPUSamples, r.GPUUtilPct, util / nUtil, relTol},
		{"cpu_util_pct", api.SourceHostSamples, r.CPUUtilPct, cpu, relTol},
		{"step_time_s", api.SourceSteps, r.StepTimeS, stepS, relTol},
		{"steps_per_s", api.SourceSteps, r.StepsPerS, sps, relTol},
	} {
		if c.got == nil {
			t.Errorf("%s: the report's %s column is empty", r.Name, c.col)
			continue
		}
		if g := float64(*c.got); math.Abs(g-c.want) > c.tol*math.Abs(c.want) {
			t.Errorf("%s: %s = %v, recomputed from the records %v (rel. diff %.2g)", r.Name, c.col, g, c.want, math.Abs(g-c.want)/math.Abs(c.want))
		}
		if r.Sources[c.col] != c.src {
			t.Errorf("%s: %s came from %q, want the window's own %q", r.Name, c.col, r.Sources[c.col], c.src)
		}
	}
	if r.Note != "" {
		t.Errorf("%s: note %q, want none: no figure should fall back on these runs", r.Name, r.Note)
	}
	t.Logf("%-26s from step %2d, window %5.2f s (%2.0f GPU samples): %5.0f MB NVML, %4.0f MB alloc peak, GPU %4.1f%%, CPU %4.1f%%, %.4f s/step",
		r.Name, bd.FromStep, to.Sub(from).Seconds(), nMem, mem/nMem/1e6, alloc*1000, util/nUtil, cpu, stepS)
}
