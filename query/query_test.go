package query_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/query"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// env is a query server over a fresh database.
type env struct {
	t   *testing.T
	s   *store.Store
	srv *httptest.Server
}

func newEnv(t *testing.T) *env {
	t.Helper()
	s := storetest.NewStore(t)
	e := echo.New()
	query.New(s, query.Options{}).Register(e.Group("/api/v1"))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return &env{t: t, s: s, srv: srv}
}

func (e *env) write(recs ...api.Record) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for len(recs) > 0 {
		n := min(len(recs), 20000)
		if _, err := e.s.WriteBatch(ctx, recs[:n]); err != nil {
			e.t.Fatalf("write batch: %v", err)
		}
		recs = recs[n:]
	}
}

// get fetches path and decodes the JSON answer into out, failing unless
// the status is want.
func (e *env) get(path string, want int, out any) {
	e.t.Helper()
	res, err := http.Get(e.srv.URL + "/api/v1" + path)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	var raw json.RawMessage
	if err := json.NewDecoder(res.Body).Decode(&raw); err != nil {
		e.t.Fatalf("GET %s: decode: %v", path, err)
	}
	if res.StatusCode != want {
		e.t.Fatalf("GET %s: status %d, want %d: %s", path, res.StatusCode, want, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			e.t.Fatalf("GET %s: decode %T: %v (%s)", path, out, err, raw)
		}
	}
}

func runRec(id string, meta *api.RunMeta, tags ...string) api.Record {
	return api.Record{Run: &api.Run{Kind: "run", RunID: id, Project: "p", Name: id, StartedAt: api.T(t0), Meta: meta, Tags: tags}}
}

func stepRec(id string, rank int, step int64, fill func(*api.Step)) api.Record {
	s := &api.Step{Kind: "step", RunID: id, Rank: rank, Step: api.Ptr(step), Time: api.T(t0.Add(time.Duration(step) * time.Second))}
	if fill != nil {
		fill(s)
	}
	return api.Record{Step: s}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestSeriesSpikeSurvivesDownsampling(t *testing.T) {
	e := newEnv(t)
	recs := []api.Record{runRec("r1", nil)}
	const n = 50000
	for i := int64(0); i < n; i++ {
		loss := 2.0 - float64(i)/n
		if i == 31337 {
			loss = 1000 // one bad step
		}
		recs = append(recs, stepRec("r1", 0, i, func(s *api.Step) { s.Loss = api.F(loss) }))
	}
	e.write(recs...)
	for _, maxPoints := range []int{100, 1000, 7} {
		var res api.SeriesResponse
		e.get(fmt.Sprintf("/runs/r1/series?metric=loss&max_points=%d", maxPoints), 200, &res)
		if len(res.Series) != 1 {
			t.Fatalf("series: %d, want 1", len(res.Series))
		}
		s := res.Series[0]
		if len(s.Points) == 0 || len(s.Points) > maxPoints {
			t.Fatalf("max_points=%d: got %d points", maxPoints, len(s.Points))
		}
		var top float64
		var total int64
		for _, p := range s.Points {
			top = math.Max(top, float64(p.Max))
			total += p.Count
		}
		if top != 1000 {
			t.Errorf("max_points=%d: highest max %v, want the spike 1000", maxPoints, top)
		}
		if total != n {
			t.Errorf("max_points=%d: points cover %d rows, want %d", maxPoints, total, n)
		}
		// The first bucket's mean is the mean of its rows.
		p := s.Points[0]
		var sum float64
		for i := int64(0); i < p.Count; i++ {
			sum += 2.0 - float64(i)/n
		}
		if !near(float64(p.Value), sum/float64(p.Count)) || p.Step != 0 || !p.Time.Equal(t0) {
			t.Errorf("max_points=%d: first point %+v, want mean %v at step 0", maxPoints, p, sum/float64(p.Count))
		}
	}
	// A range not aligned with the rollups reads raw rows at its edges.
	var res api.SeriesResponse
	e.get("/runs/r1/series?metric=loss&from_step=31250&to_step=31449&max_points=2", 200, &res)
	var total int64
	var top float64
	for _, p := range res.Series[0].Points {
		total += p.Count
		top = math.Max(top, float64(p.Max))
	}
	if total != 200 || top != 1000 {
		t.Errorf("edge range: %d rows, max %v; want 200 rows and the spike", total, top)
	}
	// Rewriting a step (a resumed run) refreshes its rollup bucket.
	e.write(api.Record{Step: &api.Step{Kind: "step", RunID: "r1", Rank: 0, Step: api.Ptr(int64(31337)),
		Time: api.T(t0.Add(100000 * time.Second)), Loss: api.F(1)}})
	e.get("/runs/r1/series?metric=loss&max_points=100", 200, &res)
	for _, p := range res.Series[0].Points {
		if p.Max > 3 {
			t.Errorf("after rewrite, the spike is still there: %+v", p)
		}
	}
}

func TestSeriesNonFiniteRankAllAndUserMetrics(t *testing.T) {
	e := newEnv(t)
	recs := []api.Record{runRec("r2", nil)}
	for rank := 0; rank < 3; rank++ {
		for i := int64(0); i < 300; i++ {
			recs = append(recs, stepRec("r2", rank, i, func(s *api.Step) {
				s.Loss = api.F(float64(rank) + 1)
				s.Metrics = map[string]api.Float{"tokens_per_gpu": api.Float(float64(i))}
				if i == 150 && rank == 0 {
					s.Loss = api.F(math.NaN())
				}
			}))
		}
	}
	e.write(recs...)
	var res api.SeriesResponse
	e.get("/runs/r2/series?metric=loss&metric=metrics.tokens_per_gpu&rank=all&max_points=3", 200, &res)
	if len(res.Series) != 6 {
		t.Fatalf("rank=all with 2 metrics: %d series, want 6", len(res.Series))
	}
	for _, s := range res.Series {
		switch s.Metric {
		case "loss":
			for _, p := range s.Points {
				want := float64(s.Rank) + 1
				if s.Rank == 0 && p.Step <= 150 && 150 < p.Step+s.BucketSteps {
					if !math.IsNaN(float64(p.Max)) {
						t.Errorf("rank 0 bucket with NaN: max %v, want NaN", p.Max)
					}
					continue
				}
				if float64(p.Value) != want {
					t.Errorf("rank %d loss %v, want %v", s.Rank, p.Value, want)
				}
			}
		case "metrics.tokens_per_gpu":
			if len(s.Points) != 3 || s.Points[2].Max != 299 || s.Points[0].Min != 0 {
				t.Errorf("user metric points %+v", s.Points)
			}
		}
	}
	// NaN travels as a string.
	res2, err := http.Get(e.srv.URL + "/api/v1/runs/r2/series?metric=loss&from_step=150&to_step=150")
	if err != nil {
		t.Fatal(err)
	}
	defer res2.Body.Close()
	var raw map[string]any
	_ = json.NewDecoder(res2.Body).Decode(&raw)
	b, _ := json.Marshal(raw)
	if !strings.Contains(string(b), `"value":"NaN"`) {
		t.Errorf("NaN loss not sent as \"NaN\": %s", b)
	}
}

func TestHeatmapCellIsMeanOfRows(t *testing.T) {
	e := newEnv(t)
	names := []string{"embeddings", "encoder.0", "encoder.1", "classifier"}
	recs := []api.Record{runRec("h1", nil)}
	fwd := func(step int64, l int) float64 { return float64(l+1) + float64(step%7)/10 }
	for i := int64(0); i < 5000; i++ {
		f := make([]api.Float, len(names))
		b := make([]api.Float, len(names))
		for l := range names {
			f[l] = api.Float(fwd(i, l))
			b[l] = 2 * f[l]
		}
		recs = append(recs, api.Record{Layers: &api.Layers{Kind: "layers", RunID: "h1", Step: api.Ptr(i),
			Time: api.T(t0.Add(time.Duration(i) * time.Second)), Names: names, ForwardMS: f, BackwardMS: b}})
	}
	e.write(recs...)
	for _, tc := range []struct {
		q     string
		pass  string
		scale float64
	}{
		{"max_steps=10", "forward", 1}, // width 500: rollups
		{"max_steps=10&pass=backward", "backward", 2},
		{"max_steps=100&from_step=123&to_step=4321", "forward", 1}, // raw edges
		{"max_steps=5000", "forward", 1},                           // raw
	} {
		var hm api.Heatmap
		e.get("/runs/h1/heatmap?"+tc.q, 200, &hm)
		if strings.Join(hm.Layers, ",") != strings.Join(names, ",") || hm.Pass != tc.pass {
			t.Fatalf("%s: layers %v pass %s", tc.q, hm.Layers, hm.Pass)
		}
		lo, hi := int64(0), int64(4999)
		if strings.Contains(tc.q, "from_step") {
			lo, hi = 123, 4321
		}
		for j, first := range hm.Steps {
			bEnd := min((first/hm.BucketSteps+1)*hm.BucketSteps-1, hi)
			for l := range names {
				var sum float64
				for s := max(first, lo); s <= bEnd; s++ {
					sum += tc.scale * fwd(s, l)
				}
				want := sum / float64(bEnd-max(first, lo)+1)
				got := hm.Values[l][j]
				if got == nil || !near(float64(*got), want) {
					t.Fatalf("%s: cell [%s][step %d] = %v, want %v", tc.q, names[l], first, got, want)
				}
			}
		}
		if len(hm.Steps) == 0 || hm.Steps[0] != lo {
			t.Errorf("%s: first column at %v", tc.q, hm.Steps)
		}
	}
}

func TestEvalsCarryTrainLoss(t *testing.T) {
	e := newEnv(t)
	recs := []api.Record{runRec("e1", nil)}
	for i := int64(0); i <= 400; i += 5 {
		recs = append(recs, stepRec("e1", 0, i, func(s *api.Step) { s.Loss = api.F(1 / float64(i+1)) }))
	}
	for _, st := range []int64{200, 400, 403} {
		recs = append(recs, api.Record{Eval: &api.Eval{Kind: "eval", RunID: "e1", Step: api.Ptr(st), Time: api.T(t0.Add(time.Duration(st) * time.Second)),
			Loss: api.F(0.3), Accuracy: api.F(0.9), F1: api.F(0.88), Metrics: map[string]api.Float{"auc": 0.95}}})
	}
	e.write(recs...)
	var res api.EvalsResponse
	e.get("/runs/e1/evals", 200, &res)
	if len(res.Evals) != 3 {
		t.Fatalf("evals: %d", len(res.Evals))
	}
	for i, want := range []float64{1.0 / 201, 1.0 / 401, 1.0 / 401} {
		ev := res.Evals[i]
		if ev.TrainLoss == nil || !near(float64(*ev.TrainLoss), want) || ev.Split != "val" || ev.Metrics["auc"] != 0.95 {
			t.Errorf("eval %d: %+v, want train loss %v", i, ev, want)
		}
	}
}

func TestBreakdownSkipsWarmupAndSharesSumTo100(t *testing.T) {
	e := newEnv(t)
	recs := []api.Record{runRec("b1", nil)}
	for i := int64(0); i < 400; i++ {
		stepMS, fw := 180.0, 48.0
		if i < 20 { // warm-up: slow
			stepMS, fw = 900, 300
		}
		recs = append(recs, stepRec("b1", 0, i, func(s *api.Step) {
			s.StepMS, s.ForwardMS, s.BackwardMS, s.OptimizerMS = api.F(stepMS), api.F(fw), api.F(92), api.F(28)
			s.DataMS, s.CommMS = api.F(4), api.F(7)
		}))
	}
	e.write(recs...)
	var b api.Breakdown
	e.get("/runs/b1/breakdown", 200, &b)
	if b.FromStep < 20 || b.FromStep > 60 || b.ToStep != 399 {
		t.Errorf("steady state %d..%d, want from just after the warm-up to 399", b.FromStep, b.ToStep)
	}
	sum := 0.0
	want := map[string]float64{"forward": 48, "backward": 92, "optimizer": 28, "communication": 7, "data": 4, "other": 1}
	for _, p := range b.Parts {
		sum += float64(p.SharePct)
		if !near(float64(p.MS), want[p.Name]) {
			t.Errorf("%s: %v ms, want %v", p.Name, p.MS, want[p.Name])
		}
	}
	if math.Abs(sum-100) > 1e-9 || len(b.Parts) != 6 || float64(b.StepMS) != 180 {
		t.Errorf("shares sum to %v over %d parts, step %v", sum, len(b.Parts), b.StepMS)
	}
	e.get("/runs/b1/breakdown?from_step=0", 200, &b)
	if b.FromStep != 0 || b.Steps != 400 {
		t.Errorf("from_step=0: %d..%d over %d rows", b.FromStep, b.ToStep, b.Steps)
	}
}

func TestCompareRowOfKnownRun(t *testing.T) {
	e := newEnv(t)
	meta := &api.RunMeta{Model: "pythia-160m", ZeroStage: api.Ptr(2), Precision: "fp16", WorldSize: api.Ptr(2), MicroBatch: api.Ptr(4)}
	recs := []api.Record{runRec("c1", meta), runRec("c2", &api.RunMeta{Model: "pythia-160m", ZeroStage: api.Ptr(1)})}
	recs[0].Run.SweepID, recs[1].Run.SweepID = "zero", "zero"
	recs[1].Run.StartedAt = api.T(t0.Add(time.Hour))
	// c1: 2 ranks, 100 steps each 0.5 s apart, memory 6.0/6.2 GB, util 70/80.
	for rank := 0; rank < 2; rank++ {
		for i := int64(0); i < 100; i++ {
			r := stepRec("c1", rank, i, func(s *api.Step) {
				s.StepMS = api.F(400 + float64(rank)*100)
				s.GPUMemUsedGB = api.F(6.0 + 0.2*float64(rank))
				s.GPUUtilPct = api.F(70 + 10*float64(rank))
				s.CPUUtilPct = api.F(40)
				s.ThroughputSPS = api.F(8)
				s.Loss = api.F(3 - float64(i)/100)
			})
			r.Step.Time = api.T(t0.Add(time.Duration(i) * 500 * time.Millisecond))
			recs = append(recs, r)
		}
	}
	for i := int64(0); i < 100; i++ {
		recs = append(recs, stepRec("c2", 0, i, func(s *api.Step) { s.StepMS = api.F(1000) }))
	}
	// c2 has no memory or util on its steps: GPU and host samples stand in.
	for i := 0; i < 10; i++ {
		tm := api.T(t0.Add(time.Duration(i*10) * time.Second))
		recs = append(recs, api.Record{GPU: &api.GPU{Kind: "gpu", Time: tm, Host: "n1", GPU: api.Ptr(0), RunID: "c2",
			UtilPct: api.F(90), MemUsedBytes: api.F(5e9 + float64(i)*1e8)}})
		// The host's CPU, not its processes' (30+25 %), is the CPU column.
		recs = append(recs, api.Record{Host: &api.Host{Kind: "host", Time: tm, Host: "n1", CPUUtilPct: api.F(float64(40 + 2*i)),
			Processes: []api.HostProcess{{PID: 1, RunID: "c2", CPUPct: api.F(30)}, {PID: 2, RunID: "c2", CPUPct: api.F(25)}}}})
	}
	recs = append(recs, api.Record{Eval: &api.Eval{Kind: "eval", RunID: "c1", Step: api.Ptr(int64(50)), Time: api.T(t0), Accuracy: api.F(0.8)}},
		api.Record{Eval: &api.Eval{Kind: "eval", RunID: "c1", Step: api.Ptr(int64(99)), Time: api.T(t0), Accuracy: api.F(0.7)}})
	e.write(recs...)

	var res api.CompareResponse
	e.get("/compare?sweep=zero&baseline=c2", 200, &res)
	if len(res.Rows) != 2 || res.Rows[0].RunID != "c1" || res.Rows[1].RunID != "c2" {
		t.Fatalf("rows: %+v", res.Rows)
	}
	r := res.Rows[0]
	check := func(name string, got *api.Float, want float64) {
		t.Helper()
		if got == nil || math.Abs(float64(*got)-want) > 1e-6*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("gpu_mem_mean_mb", r.GPUMemMeanMB, 6100)
	check("gpu_mem_peak_mb", r.GPUMemPeakMB, 6200)
	check("gpu_util_pct", r.GPUUtilPct, 75)
	check("cpu_util_pct", r.CPUUtilPct, 40)
	check("step_time_s", r.StepTimeS, 0.45)
	check("steps_per_s", r.StepsPerS, 2)
	check("samples_per_s", r.SamplesPerS, 16)
	check("final_loss", r.FinalLoss, 2.01)
	check("best_eval_accuracy", r.BestEvalAcc, 0.8)
	if r.ZeroStage == nil || *r.ZeroStage != 2 || r.Precision != "fp16" || r.Model != "pythia-160m" || r.Parallelism != "data" {
		t.Errorf("config: %+v", r)
	}
	b := res.Rows[1]
	check("c2 gpu_util_pct", b.GPUUtilPct, 90)
	check("c2 gpu_mem_mean_mb", b.GPUMemMeanMB, 5450)
	check("c2 gpu_mem_peak_mb", b.GPUMemPeakMB, 5900)
	// The host samples inside c2's steady state (its steps are one second
	// apart from t0), averaged here.
	var bd api.Breakdown
	e.get("/runs/c2/breakdown", 200, &bd)
	c2From, c2To := time.Duration(bd.FromStep)*time.Second, time.Duration(bd.ToStep)*time.Second
	hostMean, n := 0.0, 0
	for i := 0; i < 10; i++ {
		if at := time.Duration(i*10) * time.Second; at >= c2From && at <= c2To {
			hostMean += float64(40 + 2*i)
			n++
		}
	}
	check("c2 cpu_util_pct", b.CPUUtilPct, hostMean/float64(n))
	if b.Sources["cpu_util_pct"] != api.SourceHostSamples || b.Sources["gpu_util_pct"] != api.SourceGPUSamples || b.Note != "" {
		t.Errorf("c2 sources %v, note %q", b.Sources, b.Note)
	}
	if r.Sources["cpu_util_pct"] != api.SourceSteps || r.Sources["gpu_mem_mean_mb"] != api.SourceSteps || !strings.Contains(r.Note, "cpu_util_pct the steps carried") {
		t.Errorf("c1 sources %v, note %q", r.Sources, r.Note)
	}
	check("c2 step_time_s", b.StepTimeS, 1)
	check("delta step_time_s", r.DeltaPct["step_time_s"], -55)
	check("delta gpu_util_pct", r.DeltaPct["gpu_util_pct"], (75.0-90)/90*100)
	check("baseline delta", b.DeltaPct["step_time_s"], 0)

	// Within the sweep, against its first trial (c1, the oldest).
	e.get("/compare?sweep=zero&baseline=@first", 200, &res)
	if res.Baseline != "c1" || len(res.Rows) != 2 {
		t.Fatalf("baseline %q, rows %d: want c1, the sweep's first trial", res.Baseline, len(res.Rows))
	}
	check("c1 against itself", res.Rows[0].DeltaPct["step_time_s"], 0)
	check("c2 against c1", res.Rows[1].DeltaPct["step_time_s"], (1-0.45)/0.45*100)

	e.get("/compare?run=c2&run=c1", 200, &res)
	if len(res.Rows) != 2 || res.Rows[0].RunID != "c2" {
		t.Errorf("run= order not kept: %+v", res.Rows)
	}

	var rk api.RanksResponse
	e.get("/runs/c1/ranks?straggler_pct=5", 200, &rk)
	if len(rk.Ranks) != 2 || rk.Ranks[0].Straggler || !rk.Ranks[1].Straggler {
		t.Errorf("ranks: %+v", rk)
	}
	if float64(rk.Ranks[0].WaitMS) != 100 || float64(rk.Ranks[1].WaitMS) != 0 {
		t.Errorf("wait: rank 0 %v, rank 1 %v; want 100 and 0", rk.Ranks[0].WaitMS, rk.Ranks[1].WaitMS)
	}
}

func TestRunsMemoryAndAnnotations(t *testing.T) {
	e := newEnv(t)
	meta := &api.RunMeta{Model: "bert-large-uncased", Params: api.Ptr(int64(335141890)), ZeroStage: api.Ptr(2), Precision: "fp16",
		MicroBatch: api.Ptr(4), GradAccum: api.Ptr(4), WorldSize: api.Ptr(1), OffloadOptim: "cpu", GPUMemTotalGB: api.F(15.8),
		Command: "python train.py", GitCommit: "abc123", Versions: map[string]string{"torch": "2.3.0"}}
	recs := []api.Record{runRec("m1", meta, "simulated")}
	for i := int64(0); i < 250; i++ {
		recs = append(recs, stepRec("m1", 0, i, func(s *api.Step) {
			s.GPUMemUsedGB = api.F(10 + float64(i%3))
			s.Loss = api.F(0.5)
			s.Skipped = api.Ptr(i == 100)
			s.ThroughputSPS = api.F(20)
		}))
	}
	recs = append(recs,
		api.Record{Event: &api.Event{Kind: "event", RunID: "m1", Time: api.T(t0.Add(100 * time.Second)), Step: api.Ptr(int64(100)), Type: "overflow", Text: "loss scale 65536 -> 32768"}},
		api.Record{Eval: &api.Eval{Kind: "eval", RunID: "m1", Step: api.Ptr(int64(200)), Time: api.T(t0.Add(200 * time.Second)), Accuracy: api.F(0.93), F1: api.F(0.92)}},
		api.Record{End: &api.End{Kind: "end", RunID: "m1", Time: api.T(t0.Add(300 * time.Second)), Status: "finished"}})
	e.write(recs...)

	var list api.RunList
	e.get("/runs?tag=simulated", 200, &list)
	if list.Total != 1 || len(list.Runs) != 1 {
		t.Fatalf("runs: %+v", list)
	}
	s := list.Runs[0]
	if s.Steps != 250 || s.SkippedSteps != 1 || s.PeakGPUMemGB == nil || *s.PeakGPUMemGB != 12 || s.EffectiveBatch == nil ||
		*s.EffectiveBatch != 16 || s.BestValAccuracy == nil || *s.BestValAccuracy != 0.93 || s.Status != "finished" ||
		s.DurationS == nil || *s.DurationS != 300 || *s.MeanThroughputSPS != 20 {
		t.Errorf("summary: %+v", s)
	}
	e.get("/runs?tag=other", 200, &list)
	if list.Total != 0 || list.Runs == nil {
		t.Errorf("tag=other: %+v", list)
	}
	var d api.RunDetail
	e.get("/runs/m1", 200, &d)
	if d.Command != "python train.py" || d.GitCommit != "abc123" || d.Versions["torch"] != "2.3.0" || len(d.Ranks) != 1 {
		t.Errorf("detail: %+v", d)
	}

	var mem api.MemoryResponse
	e.get("/runs/m1/memory", 200, &mem)
	parts := map[string]api.MemoryPart{}
	for _, p := range mem.Parts {
		parts[p.Name] = p
	}
	if parts["optimizer"].Device != "cpu" || float64(parts["parameters"].Bytes) != 335141890*2 ||
		mem.PeakGPUBytes == nil || *mem.PeakGPUBytes != 12e9 || mem.GPUTotalBytes == nil || *mem.GPUTotalBytes != 15.8e9 {
		t.Errorf("memory: %+v", mem)
	}

	var an api.AnnotationsResponse
	e.get("/annotations?run_id=m1", 200, &an)
	if len(an.Annotations) != 2 || an.Annotations[0].Type != "overflow" || an.Annotations[1].Type != "eval" ||
		*an.Annotations[1].Step != 200 {
		t.Errorf("annotations: %+v", an)
	}
}

func TestGPUs(t *testing.T) {
	e := newEnv(t)
	var recs []api.Record
	for i := 0; i < 100; i++ {
		for g := 0; g < 2; g++ {
			recs = append(recs, api.Record{GPU: &api.GPU{Kind: "gpu", Time: api.T(t0.Add(time.Duration(i) * time.Second)), Host: "n1",
				GPU: api.Ptr(g), Name: "Tesla T4", RunID: "x", UtilPct: api.F(float64(i)), PowerW: api.F(70)}})
		}
	}
	e.write(recs...)
	var res api.GPUResponse
	q := url.Values{"host": {"n1"}, "from": {t0.Format(time.RFC3339)}, "to": {t0.Add(time.Hour).Format(time.RFC3339)},
		"max_points": {"10"}, "metric": {"util_pct"}}
	e.get("/gpus?"+q.Encode(), 200, &res)
	if len(res.Series) != 2 {
		t.Fatalf("series: %d", len(res.Series))
	}
	s := res.Series[1]
	if s.GPU != 1 || s.Name != "Tesla T4" || len(s.Points) > 10 || s.Points[0].Min != 0 || s.Points[len(s.Points)-1].Max != 99 {
		t.Errorf("gpu 1 series: %+v", s)
	}
	q.Set("gpu", "1")
	var one api.GPUResponse
	e.get("/gpus?"+q.Encode(), 200, &one)
	if len(one.Series) != 1 || one.Series[0].GPU != 1 || len(one.Series[0].Points) != len(s.Points) {
		t.Errorf("gpu=1: %+v", one.Series)
	}
}

func TestErrors(t *testing.T) {
	e := newEnv(t)
	e.write(runRec("r", nil))
	for _, tc := range []struct {
		path   string
		status int
		param  string
	}{
		{"/runs/nope", 404, ""},
		{"/runs/nope/series", 404, ""},
		{"/runs/nope/heatmap", 404, ""},
		{"/runs/nope/evals", 404, ""},
		{"/runs/nope/breakdown", 404, ""},
		{"/runs/nope/memory", 404, ""},
		{"/runs/nope/ranks", 404, ""},
		{"/compare?run=nope", 404, ""},
		{"/annotations?run_id=nope", 404, ""},
		{"/runs/r/series?metric=bogus", 400, "metric"},
		{"/runs/r/series?max_points=0", 400, "max_points"},
		{"/runs/r/series?rank=x", 400, "rank"},
		{"/runs/r/series?from_step=10&to_step=5", 400, "to_step"},
		{"/runs/r/heatmap?pass=sideways", 400, "pass"},
		{"/runs/r/heatmap?max_steps=-1", 400, "max_steps"},
		{"/runs/r/breakdown?from_step=abc", 400, "from_step"},
		{"/runs/r/ranks?straggler_pct=-3", 400, "straggler_pct"},
		{"/runs?limit=0", 400, "limit"},
		{"/runs?status=bogus", 400, "status"},
		{"/compare", 400, "run"},
		{"/compare?run=r&baseline=nope", 400, "baseline"},
		{"/gpus?metric=bogus", 400, "metric"},
		{"/gpus?from=yesterday", 400, "from"},
		{"/gpus?gpu=first", 400, "gpu"},
		{"/annotations?to=1&from=2", 400, "to"},
	} {
		var ae api.Error
		e.get(tc.path, tc.status, &ae)
		if ae.Param != tc.param || ae.Error == "" {
			t.Errorf("%s: error %+v, want param %q", tc.path, ae, tc.param)
		}
	}
	// Empty runs answer empty, not null, collections.
	var res api.SeriesResponse
	e.get("/runs/r/series?rank=all", 200, &res)
	if res.Series == nil {
		t.Errorf("series of an empty run: %+v", res)
	}
}
