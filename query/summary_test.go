package query_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// summaryShapes writes runs of the shapes a page of the runs list mixes,
// each with what it should show: finished with every figure; running with
// known total steps, its step time from raw steps, from rollups (a long
// run) or from the clock (no step times); silent past the stall limit;
// without steps; with evaluations of another split only; killed; its ranks
// not starting at 0. Half of them are trials of sweep "sw".
func summaryShapes(e *env) map[string]func(t *testing.T, s api.RunSummary) {
	now := time.Now().Add(-time.Minute)
	at := func(steps int64, per time.Duration) func(i int64) time.Time {
		start := now.Add(-time.Duration(steps) * per)
		return func(i int64) time.Time { return start.Add(time.Duration(i) * per) }
	}
	run := func(id, sweep string, meta *api.RunMeta, start time.Time) api.Record {
		r := runRec(id, meta, "shape")
		r.Run.SweepID, r.Run.StartedAt = sweep, api.T(start)
		return r
	}
	step := func(id string, rank int, i int64, tm time.Time, fill func(*api.Step)) api.Record {
		r := stepRec(id, rank, i, fill)
		r.Step.Time = api.T(tm)
		return r
	}
	eval := func(id, split string, i int64, tm time.Time, acc, f1, loss float64) api.Record {
		return api.Record{Eval: &api.Eval{Kind: "eval", RunID: id, Step: api.Ptr(i), Time: api.T(tm), Split: split,
			Accuracy: api.F(acc), F1: api.F(f1), Loss: api.F(loss)}}
	}
	end := func(id, status string, tm time.Time) api.Record {
		return api.Record{End: &api.End{Kind: "end", RunID: id, Time: api.T(tm), Status: status}}
	}
	total := func(n int64) *api.RunMeta { return &api.RunMeta{TotalSteps: api.Ptr(n)} }
	var recs []api.Record

	// done: finished, two ranks, every figure, GPU samples, evaluations.
	tDone := at(150, time.Second)
	recs = append(recs, run("done", "sw", &api.RunMeta{Model: "m", MicroBatch: api.Ptr(4), GradAccum: api.Ptr(2), WorldSize: api.Ptr(2)}, tDone(0)))
	for i := int64(1); i <= 150; i++ {
		for rank := 0; rank < 2; rank++ {
			recs = append(recs, step("done", rank, i, tDone(i), func(s *api.Step) {
				s.Loss, s.StepMS, s.ThroughputSPS = api.F(3-float64(i)/100+float64(rank)/1000), api.F(200+float64(i%4)), api.F(40)
				s.GPUUtilPct, s.GPUMemUsedGB, s.GPUMemPeakGB = api.F(90), api.F(30+float64(rank)), api.F(25)
				s.TFLOPS, s.MFU, s.Skipped = api.F(100), api.F(0.3), api.Ptr(i%50 == 0)
			}))
		}
		if i%10 == 0 {
			recs = append(recs, gpuRec("done", "n1", 0, tDone(i), 88, 40e9), gpuRec("done", "n1", 1, tDone(i), 86, 41e9))
		}
		if i%50 == 0 {
			recs = append(recs, eval("done", "val", i, tDone(i), 0.5+float64(i)/1000, 0.4+float64(i)/1000, 1-float64(i)/1000))
		}
	}
	recs = append(recs, end("done", api.StatusFinished, tDone(151)))

	// eta: running, 200 of 1,000 steps, a warm-up, utilisation only from
	// the GPU samples.
	tETA := at(200, time.Second)
	recs = append(recs, run("eta", "sw", total(1000), tETA(0)))
	for i := int64(1); i <= 200; i++ {
		ms := 400 + float64(i%5)*50
		if i < 10 {
			ms = 3000
		}
		recs = append(recs, step("eta", 0, i, tETA(i), func(s *api.Step) { s.StepMS, s.Loss = api.F(ms), api.F(2) }))
		if i%20 == 0 {
			recs = append(recs, gpuRec("eta", "n2", 0, tETA(i), 70, 20e9))
		}
	}

	// long: running, more steps than a rank's raw reads: its steady state
	// and step time come from rollups.
	tLong := at(6000, 100*time.Millisecond)
	recs = append(recs, run("long", "", total(20000), tLong(0)))
	for i := int64(1); i <= 6000; i++ {
		recs = append(recs, step("long", 0, i, tLong(i), func(s *api.Step) { s.StepMS, s.Loss = api.F(100+float64(i%3)), api.F(1.5) }))
	}

	// clock: running on ranks 1 and 2, no step times: the clock's.
	tClock := at(100, 2*time.Second)
	recs = append(recs, run("clock", "sw", total(300), tClock(0)))
	for i := int64(1); i <= 100; i++ {
		for _, rank := range []int{1, 2} {
			recs = append(recs, step("clock", rank, i, tClock(i), func(s *api.Step) { s.Loss = api.F(4) }))
		}
	}

	// silent: running, steps long ago: no estimate.
	recs = append(recs, run("silent", "", total(1000), t0))
	for i := int64(1); i <= 50; i++ {
		recs = append(recs, stepRec("silent", 0, i, func(s *api.Step) { s.StepMS = api.F(300) }))
	}

	// bare: announced, nothing since.
	recs = append(recs, run("bare", "sw", &api.RunMeta{MicroBatch: api.Ptr(8), WorldSize: api.Ptr(4), PipelineStages: api.Ptr(2)}, t0))

	// tested: killed, evaluations of the test split only.
	recs = append(recs, run("tested", "", nil, t0))
	for i := int64(1); i <= 30; i++ {
		recs = append(recs, stepRec("tested", 0, i, func(s *api.Step) { s.Loss = api.F(1) }))
	}
	recs = append(recs, eval("tested", "test", 10, t0.Add(10*time.Second), 0.7, 0.6, 0.9),
		eval("tested", "test", 20, t0.Add(20*time.Second), 0.65, 0.66, 0.8),
		end("tested", api.StatusKilled, t0.Add(time.Minute)))
	e.write(recs...)

	f := func(v *api.Float) float64 {
		if v == nil {
			return -1
		}
		return float64(*v)
	}
	return map[string]func(t *testing.T, s api.RunSummary){
		"done": func(t *testing.T, s api.RunSummary) {
			if s.Status != api.StatusFinished || s.Steps != 150 || s.LastStep == nil || *s.LastStep != 150 || s.SkippedSteps != 6 ||
				!near(f(s.FinalLoss), 1.5) || !near(f(s.BestValAccuracy), 0.65) || !near(f(s.FinalValF1), 0.55) ||
				!near(f(s.PeakGPUMemGB), 41) || !near(f(s.PeakGPUMemAllocGB), 25) || !near(f(s.MeanGPUUtilPct), 90) ||
				s.EffectiveBatch == nil || *s.EffectiveBatch != 16 || s.MeanMFU == nil || s.ETASeconds != nil {
				t.Errorf("done: %s", asJSON(s))
			}
		},
		"eta": func(t *testing.T, s api.RunSummary) {
			if !near(f(s.MeanGPUUtilPct), 70) || !near(f(s.PeakGPUMemGB), 20) || f(s.ETASeconds) < 800*0.4 || f(s.ETASeconds) > 800*0.6 {
				t.Errorf("eta: util %v, peak %v, eta %v", f(s.MeanGPUUtilPct), f(s.PeakGPUMemGB), f(s.ETASeconds))
			}
		},
		"long": func(t *testing.T, s api.RunSummary) {
			if s.Steps != 6000 || f(s.ETASeconds) < 14000*0.1 || f(s.ETASeconds) > 14000*0.102 {
				t.Errorf("long: steps %d, eta %v", s.Steps, f(s.ETASeconds))
			}
		},
		"clock": func(t *testing.T, s api.RunSummary) {
			if !near(f(s.ETASeconds), 200*2) || s.ETAAt == nil {
				t.Errorf("clock: eta %v at %v", f(s.ETASeconds), s.ETAAt)
			}
		},
		"silent": func(t *testing.T, s api.RunSummary) {
			if s.Steps != 50 || s.ETASeconds != nil {
				t.Errorf("silent: steps %d, eta %v", s.Steps, f(s.ETASeconds))
			}
		},
		"bare": func(t *testing.T, s api.RunSummary) {
			if s.Steps != 0 || s.LastStep != nil || s.FinalLoss != nil || s.EffectiveBatch == nil || *s.EffectiveBatch != 16 {
				t.Errorf("bare: %s", asJSON(s))
			}
		},
		"tested": func(t *testing.T, s api.RunSummary) {
			if s.Status != api.StatusKilled || !near(f(s.BestValAccuracy), 0.7) || !near(f(s.FinalValAccuracy), 0.65) || !near(f(s.FinalValLoss), 0.8) {
				t.Errorf("tested: %s", asJSON(s))
			}
		},
	}
}

// diffFields lists the fields, by JSON name, in which a and b (structs of
// one type) differ.
func diffFields(a, b any) []string {
	var out []string
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	for i := 0; i < va.NumField(); i++ {
		if x, y := va.Field(i).Interface(), vb.Field(i).Interface(); !reflect.DeepEqual(x, y) {
			name, _, _ := strings.Cut(va.Type().Field(i).Tag.Get("json"), ",")
			out = append(out, fmt.Sprintf("%s: %s vs %s", name, show(x), show(y)))
		}
	}
	return out
}

// asJSON is v as the API answers it.
func asJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// show prints a field's value, through its pointer.
func show(v any) string {
	if r := reflect.ValueOf(v); r.Kind() == reflect.Pointer && !r.IsNil() {
		return fmt.Sprint(r.Elem().Interface())
	}
	return fmt.Sprint(v)
}

// Every row of the runs list, and of a sweep's runs, is the summary of
// that run's own page, field by field, whatever the run's shape: the list
// reads its page's summaries together, a run's page reads one.
func TestRunsListRowsAreTheRunsSummaries(t *testing.T) {
	e := newEnv(t)
	checks := summaryShapes(e)
	// A first list refreshes every rollup: both reads then see the same.
	e.get("/runs?limit=100", 200, nil)
	own := map[string]api.RunSummary{}
	for id := range checks {
		var d api.RunDetail
		e.get("/runs/"+id, 200, &d)
		own[id] = d.RunSummary
	}
	for _, path := range []string{"/runs?limit=100", "/runs?sweep=sw&limit=100"} {
		var list api.RunList
		e.get(path, 200, &list)
		seen := map[string]bool{}
		for _, row := range list.Runs {
			s, ok := own[row.RunID]
			if !ok {
				t.Errorf("%s: unknown run %q", path, row.RunID)
				continue
			}
			seen[row.RunID] = true
			if d := diffFields(row, s); len(d) > 0 {
				t.Errorf("%s: run %s differs from its own summary (list vs own):\n  %s", path, row.RunID, strings.Join(d, "\n  "))
			}
			checks[row.RunID](t, row)
		}
		for id, s := range own {
			if in := path == "/runs?limit=100" || s.SweepID == "sw"; in != seen[id] {
				t.Errorf("%s: run %s listed %v, want %v", path, id, seen[id], in)
			}
		}
	}
	for id, check := range checks {
		check(t, own[id])
	}
}
