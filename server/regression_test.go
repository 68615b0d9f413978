package server

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store/storetest"
)

// plant is what a corpus run changes from the baseline.
type plant struct {
	slowLayer   int     // layer index made 10 % slower, -1 for none
	torch       string  // torch version
	throttleGPU int     // rank whose GPU throttles (compute 20 % slower, clock down), -1 for none
	dataRank    int     // rank with a slow input pipeline, -1 for none
	noise       float64 // the run's own offset of its step time, a fraction
	resumeAt    int     // a step the run resumes from after ten minutes down, 0 for none
}

var layerNames = []string{"embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "blocks.4", "blocks.5", "head"}

const corpusRanks, corpusSteps = 4, 300

// restartDown is how long a resumed corpus run was down.
const restartDown = 10 * time.Minute

// corpusRun builds the records of one generated run: 4 ranks on two
// hosts (ranks 0–1 on n1, 2–3 on n2), 300 steps of about 100 ms with
// phases, layers every step and a GPU sample a second a GPU; every rank
// waits in the collective for the slowest one, as synchronous data
// parallel training does.
func corpusRun(id string, start time.Time, p plant, seed int) []string {
	meta := map[string]any{"model": "gpt-corpus", "params": 125000000, "world_size": corpusRanks, "precision": "bf16",
		"parallelism": "data", "micro_batch": 8, "git_commit": "abc123",
		"versions": map[string]string{"torch": p.torch, "cuda": "12.4", "nccl": "2.21"}}
	run := map[string]any{"kind": "run", "run_id": id, "project": "corpus", "started_at": start.UTC().Format(time.RFC3339Nano),
		"meta": meta, "config": map[string]any{"train_micro_batch_size_per_gpu": 8, "bf16": map[string]any{"enabled": true}}}
	line := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	lines := []string{line(run)}
	// A deterministic jitter of about ±1 %.
	jit := func(step, rank, k int) float64 {
		x := math.Sin(float64(step*7919+rank*104729+k*1299709+seed*15485863)) * 43758.5453
		return 1 + 0.02*(x-math.Floor(x)-0.5)
	}
	t := start
	for step := 1; step <= corpusSteps; step++ {
		type work struct{ data, fwd, bwd, opt float64 }
		var ws [corpusRanks]work
		var layersF, layersB [corpusRanks][]float64
		busiest := 0.0
		for rank := range corpusRanks {
			f, b := 0.0, 0.0
			for li := range layerNames {
				lf, lb := 3.0*jit(step, rank, li)*(1+p.noise), 6.0*jit(step, rank, li+50)*(1+p.noise)
				if li == p.slowLayer {
					lf, lb = lf*1.1, lb*1.1
				}
				if rank == p.throttleGPU {
					lf, lb = lf*1.2, lb*1.2
				}
				layersF[rank], layersB[rank] = append(layersF[rank], lf), append(layersB[rank], lb)
				f, b = f+lf, b+lb
			}
			w := work{data: 5 * jit(step, rank, 90), fwd: f, bwd: b, opt: 10 * jit(step, rank, 91)}
			if rank == p.dataRank {
				w.data += 30
			}
			ws[rank] = w
			busiest = max(busiest, w.data+w.fwd+w.bwd+w.opt)
		}
		stepMS := busiest + 8 // the all-reduce itself
		if p.resumeAt > 0 && step == p.resumeAt+1 {
			t = t.Add(restartDown)
			lines = append(lines, line(map[string]any{"kind": "event", "run_id": id, "time": t.UTC().Format(time.RFC3339Nano),
				"type": api.EventResume, "step": p.resumeAt}))
		}
		t = t.Add(time.Duration(stepMS * float64(time.Millisecond)))
		for rank := range corpusRanks {
			w := ws[rank]
			wait := busiest - (w.data + w.fwd + w.bwd + w.opt)
			lines = append(lines, line(map[string]any{"kind": "step", "run_id": id, "rank": rank, "step": step,
				"time": t.UTC().Format(time.RFC3339Nano), "step_ms": stepMS, "data_ms": w.data, "forward_ms": w.fwd, "backward_ms": w.bwd,
				"optimizer_ms": w.opt, "sync_wait_ms": wait + 8, "throughput_sps": 8000 / stepMS, "mfu": 0.4 * 100 / stepMS,
				"gpu_mem_used_gb": 30.0 + 0.01*jit(step, rank, 92), "loss": 2.0}))
			lines = append(lines, line(map[string]any{"kind": "layers", "run_id": id, "rank": rank, "step": step,
				"time": t.UTC().Format(time.RFC3339Nano), "names": layerNames, "forward_ms": layersF[rank], "backward_ms": layersB[rank]}))
		}
	}
	end := t
	for s := start; s.Before(end); s = s.Add(time.Second) {
		for rank := range corpusRanks {
			host, clock, reasons := "n1", 1980.0, 0
			if rank >= 2 {
				host = "n2"
			}
			if rank == p.throttleGPU {
				clock, reasons = 1500, 0x40
			}
			lines = append(lines, line(map[string]any{"kind": "gpu", "time": s.UTC().Format(time.RFC3339Nano), "host": host, "gpu": rank % 2,
				"run_id": id, "rank": rank, "util_pct": 95, "sm_clock_mhz": clock, "throttle_reasons": reasons}))
		}
	}
	lines = append(lines, line(map[string]any{"kind": "end", "run_id": id, "time": end.UTC().Format(time.RFC3339Nano), "status": "finished"}))
	return lines
}

func getRegression(t *testing.T, r *running, run, query string) api.Regression {
	t.Helper()
	code, b, _ := do(t, "GET", r.url+"/api/v1/runs/"+run+"/regression"+query, "", "")
	var out api.Regression
	if code != 200 || json.Unmarshal(b, &out) != nil {
		t.Fatalf("GET /runs/%s/regression%s = %d %s", run, query, code, b)
	}
	return out
}

// The planted-cause corpus: four baseline runs of one fingerprint, then
// one run with a layer 10 % slower, one with a newer torch and no other
// change, one with a throttled GPU, one with a data straggler and a
// control. Each planted cause must be named with its place; the newer
// library and the controls must raise nothing, through the API and
// through the evaluator's regression alerts.
func TestRegressionCorpus(t *testing.T) {
	r := alertServer(t)
	t0 := time.Now().Add(-3 * time.Hour).Truncate(time.Second)
	none := plant{slowLayer: -1, torch: "2.3.0", throttleGPU: -1, dataRank: -1}
	runs := []struct {
		id string
		p  plant
	}{
		{"base-1", none}, {"base-2", withNoise(none, 0.004)}, {"base-3", withNoise(none, -0.003)}, {"base-4", withNoise(none, 0.002)},
		{"slow-layer", plant{slowLayer: 3, torch: "2.3.0", throttleGPU: -1, dataRank: -1}},
		{"new-torch", plant{slowLayer: -1, torch: "2.4.0", throttleGPU: -1, dataRank: -1, noise: 0.001}},
		{"throttled", plant{slowLayer: -1, torch: "2.3.0", throttleGPU: 1, dataRank: -1}},
		{"data-straggler", plant{slowLayer: -1, torch: "2.3.0", throttleGPU: -1, dataRank: 2}},
		{"control", withNoise(none, -0.001)},
	}
	for i, run := range runs {
		ingestLines(t, r, corpusRun(run.id, t0.Add(time.Duration(i)*10*time.Minute), run.p, i))
	}
	for _, run := range runs {
		waitRollups(t, r, run.id)
	}
	// The baseline runs compare with the newest of those before them: the
	// controls of the corpus, with base-2…4 and the new torch.
	baseline := "?baseline=base-1,base-2,base-3,base-4"
	type want struct{ cause, place string }
	planted := map[string]want{
		"slow-layer":     {"layer", "blocks.2"},
		"throttled":      {"throttling", "rank 1"},
		"data-straggler": {"data", "rank 2"},
	}
	named, falseAlarms := 0, 0
	for _, run := range runs[4:] {
		q := baseline
		got := getRegression(t, r, run.id, q)
		t.Logf("%s: %s", run.id, got.Sentence)
		w, isPlanted := planted[run.id]
		if !isPlanted {
			if got.Regressed {
				falseAlarms++
				t.Errorf("%s: regression raised on a run without a planted slowdown: %s", run.id, got.Sentence)
			}
			continue
		}
		place := ""
		switch {
		case len(got.Layers) > 0 && w.cause == "layer":
			place = strings.TrimSuffix(strings.TrimSuffix(got.Layers[0].Name, " forward"), " backward")
		case len(got.Ranks) > 0:
			place = got.Ranks[0].Name
		}
		if got.Regressed && got.Cause == w.cause && place == w.place {
			named++
		} else {
			t.Errorf("%s: got regressed=%v cause %q place %q, want cause %q at %q: %s", run.id, got.Regressed, got.Cause, place, w.cause, w.place, got.Sentence)
		}
	}
	nt := getRegression(t, r, "new-torch", baseline)
	if !slices.ContainsFunc(nt.Differs, func(d api.Difference) bool { return d.What == "version" && d.Key == "torch" && d.Value == "2.4.0" }) {
		t.Errorf("new-torch: the version difference is not listed: %+v", nt.Differs)
	}
	th := getRegression(t, r, "throttled", baseline)
	if !slices.Contains(th.Hosts, "n1") {
		t.Errorf("throttled: hosts %v, want n1", th.Hosts)
	}
	for _, run := range runs[1:4] {
		// Each baseline run against the baseline runs before it, by
		// fingerprint alone.
		if got := getRegression(t, r, run.id, ""); got.Regressed || got.Basis != "fingerprint" {
			falseAlarms++
			t.Errorf("%s (control, basis %s, %d runs): %s", run.id, got.Basis, len(got.Baseline), got.Sentence)
		}
	}
	t.Logf("planted causes named: %d/%d; false alarms on controls: %d/%d", named, len(planted), falseAlarms, 5)

	// The evaluator raises the same, by fingerprint: the planted runs'
	// baselines hold the controls before them.
	waitFor(t, "regression alerts", func() bool {
		n := 0
		for _, a := range listAlerts(t, r, "kind=regression&state=open") {
			if _, ok := planted[a.RunID]; ok {
				n++
			}
		}
		return n == len(planted)
	})
	for _, a := range listAlerts(t, r, "kind=regression") {
		if _, ok := planted[a.RunID]; !ok {
			t.Errorf("regression alert on %s, which has no planted slowdown: %s", a.RunID, a.Text)
		}
	}
}

func withNoise(p plant, n float64) plant { p.noise = n; return p }

// Bad parameters of the regression route are 400s naming them; an
// unknown run is a 404.
func TestRegressionBadInput(t *testing.T) {
	r := alertServer(t)
	ingestLines(t, r, corpusRun("only", time.Now().Add(-time.Hour), plant{slowLayer: -1, torch: "2.3.0", throttleGPU: -1, dataRank: -1}, 1))
	for q, param := range map[string]string{
		"?baseline=nope": "baseline",
		"?baseline=only": "baseline",
		"?baseline=" + strings.Repeat("a,", 9) + "a": "baseline",
	} {
		code, b, _ := do(t, "GET", r.url+"/api/v1/runs/only/regression"+q, "", "")
		if e := wantJSONError(t, b); code != 400 || e.Param != param {
			t.Errorf("%s: %d %s, want 400 naming %s", q, code, b, param)
		}
	}
	if code, _, _ := do(t, "GET", r.url+"/api/v1/runs/missing/regression", "", ""); code != 404 {
		t.Errorf("unknown run: %d, want 404", code)
	}
	got := getRegression(t, r, "only", "")
	if got.Regressed || got.Note != "no baseline" {
		t.Errorf("a run without comparable runs: %+v", got)
	}
	_ = fmt.Sprint()
}

// BenchmarkRegression measures one GET /runs/{id}/regression over a
// project of nine corpus runs (the run and eight baselines by
// fingerprint, each profiled from its rollups), warm rollups.
func BenchmarkRegression(b *testing.B) {
	r := start(b, New(testConfig(), storetest.NewStore(b), nil))
	t0 := time.Now().Add(-3 * time.Hour).Truncate(time.Second)
	none := plant{slowLayer: -1, torch: "2.3.0", throttleGPU: -1, dataRank: -1}
	for i := range 9 {
		lines := corpusRun(fmt.Sprintf("bench-%d", i), t0.Add(time.Duration(i)*10*time.Minute), withNoise(none, float64(i)*0.001), i)
		if code, body, _ := do(b, "POST", r.url+"/api/v1/ingest", "", strings.Join(lines, "\n")+"\n"); code != 200 {
			b.Fatalf("ingest: %d %s", code, body)
		}
	}
	url := r.url + "/api/v1/runs/bench-8/regression"
	do(b, "GET", url, "", "")
	for b.Loop() {
		if code, body, _ := do(b, "GET", url, "", ""); code != 200 {
			b.Fatalf("%d %s", code, body)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N)/9, "ms/run")
}
