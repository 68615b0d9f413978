package query_test

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/query"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// summaryRun is a run of 8 ranks read from its rollups (more rows than
// store.ExactRankRows): slow first steps, then rank-dependent figures.
func summaryRun(id string, from, to int64) []api.Record {
	var recs []api.Record
	if from == 0 {
		recs = append(recs, runRec(id, &api.RunMeta{WorldSize: api.Ptr(8)}))
	}
	for rank := 0; rank < 8; rank++ {
		for i := from; i < to; i++ {
			recs = append(recs, stepRec(id, rank, i, func(s *api.Step) {
				ms := 100 + float64(rank) + float64(i%7)
				if i < 40 {
					ms = 900 - 10*float64(i) // warm-up
				}
				s.StepMS, s.CommMS, s.CommExposedMS = api.F(ms), api.F(ms/5), api.F(ms/9)
				s.GPUMemUsedGB, s.GPUMemPeakGB = api.F(30+float64(rank)+float64(i%13)/10), api.F(20+float64(rank))
				s.GPUUtilPct, s.CPUUtilPct = api.F(80+float64(i%11)), api.F(12+float64(rank))
				s.ThroughputSPS, s.TFLOPS, s.MFU = api.F(64+float64(i%5)), api.F(150+float64(rank)), api.F(0.4+float64(i%3)/100)
			}))
		}
	}
	return recs
}

func endRec(id string) api.Record {
	return api.Record{End: &api.End{Kind: "end", RunID: id, Time: api.T(t0.Add(time.Hour)), Status: api.StatusFinished}}
}

// compareOf reads /compare of runs and returns its answer and the rollup
// lag headers.
func compareOf(t *testing.T, e *env, runs ...string) (api.CompareResponse, string) {
	t.Helper()
	q := ""
	for i, r := range runs {
		if i > 0 {
			q += "&"
		}
		q += "run=" + r
	}
	res, err := http.Get(e.srv.URL + "/api/v1/compare?" + q)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out api.CompareResponse
	if res.StatusCode != 200 {
		t.Fatalf("compare: status %d", res.StatusCode)
	}
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out, res.Header.Get(query.RollupLagBlocksHeader)
}

// A large run's compare row comes from its summary once one is stored,
// the same row a read computes from the rollups; while the summary is
// behind the rollups the row stays as it was and the answer says how far
// behind; the refresher brings it up to date, to the row computed from
// every step.
func TestCompareFromRunSummary(t *testing.T) {
	ctx := context.Background()
	a, b := newEnv(t), newEnv(t)
	// Finished, so that its wasted GPU-hours do not grow with the clock.
	a.write(summaryRun("big", 0, 700)...)
	a.write(endRec("big"))

	first, _ := compareOf(t, a, "big")
	sum, err := a.s.RunSummary(ctx, "big")
	if err != nil || sum == nil || !sum.Current || !sum.Computed || sum.Rows <= store.ExactRankRows || sum.Wasted == nil {
		t.Fatalf("after the first read: summary %+v, %v; want a current one of a large finished run, with its wasted GPU-hours", sum, err)
	}
	again, lag := compareOf(t, a, "big")
	if fj, aj := jsonOf(t, first), jsonOf(t, again); fj != aj || lag != "0" {
		t.Fatalf("from the summary (lag %q):\n%s\ncomputed:\n%s", lag, aj, fj)
	}

	// More steps: the rollups and the summary fall behind.
	a.write(summaryRun("big", 700, 1000)...)
	a.write(endRec("big"))
	stale, lag := compareOf(t, a, "big")
	if n, _ := strconv.Atoi(lag); n <= 0 {
		t.Fatalf("a summary behind its rollups answered with lag blocks %q", lag)
	}
	if !reflect.DeepEqual(first.Rows[0].StepTimeS, stale.Rows[0].StepTimeS) {
		t.Fatalf("stale row: step time %v, want the summary's %v", stale.Rows[0].StepTimeS, first.Rows[0].StepTimeS)
	}

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); query.RunRefresher(rctx, a.s, 20*time.Millisecond, nil) }()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		bl, err := a.s.RunRollupBacklog(ctx, "big")
		if err != nil {
			t.Fatal(err)
		}
		s, err := a.s.RunSummary(ctx, "big")
		if err != nil {
			t.Fatal(err)
		}
		if s.Current && bl.Blocks == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the refresher left the summary behind: %+v, backlog %+v", s, bl)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done

	// The same steps written at once elsewhere, read for the first time:
	// computed from the rollups.
	b.write(summaryRun("big", 0, 700)...)
	b.write(summaryRun("big", 700, 1000)...)
	b.write(endRec("big"))
	want, _ := compareOf(t, b, "big")
	got, lag := compareOf(t, a, "big")
	if lag != "0" {
		t.Errorf("an up-to-date summary answered with lag blocks %q", lag)
	}
	if gj, wj := jsonOf(t, got), jsonOf(t, want); gj != wj {
		t.Fatalf("from the refreshed summary:\n%s\ncomputed:\n%s", gj, wj)
	}
	if reflect.DeepEqual(got.Rows[0].StepTimeS, first.Rows[0].StepTimeS) {
		t.Fatalf("the summary did not change with 300 more steps: %v", got.Rows[0].StepTimeS)
	}
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The GPU figures a summary keeps (from the collector's samples, the
// steps carrying none) hold only while no sample of the run arrives: one
// that lands in the steady window afterwards is read.
func TestCompareSummaryReadsNewGPUSamples(t *testing.T) {
	e := newEnv(t)
	var recs []api.Record
	for _, r := range summaryRun("gpu", 0, 700) {
		if r.Step != nil {
			r.Step.GPUMemUsedGB, r.Step.GPUUtilPct = nil, nil
		}
		recs = append(recs, r)
	}
	for i := 0; i < 600; i += 10 {
		recs = append(recs, gpuRec("gpu", "n1", 0, t0.Add(time.Duration(100+i)*time.Second), 50, 10e9))
	}
	e.write(recs...)
	e.write(endRec("gpu"))

	first, _ := compareOf(t, e, "gpu")
	if s, err := e.s.RunSummary(context.Background(), "gpu"); err != nil || s == nil || s.GPU == nil || s.GPU.Samples != 60 {
		t.Fatalf("summary %+v, %v: want the window's 60 GPU samples kept", s, err)
	}
	again, _ := compareOf(t, e, "gpu")
	if jsonOf(t, first) != jsonOf(t, again) {
		t.Fatalf("from the summary:\n%s\ncomputed:\n%s", jsonOf(t, again), jsonOf(t, first))
	}
	if got := first.Rows[0].GPUUtilPct; got == nil || *got != 50 || first.Rows[0].Sources["gpu_util_pct"] != api.SourceGPUSamples {
		t.Fatalf("gpu_util_pct %v from %q, want 50 from the samples", got, first.Rows[0].Sources["gpu_util_pct"])
	}
	e.write(gpuRec("gpu", "n1", 0, t0.Add(305*time.Second), 100, 10e9))
	late, _ := compareOf(t, e, "gpu")
	if got, want := late.Rows[0].GPUUtilPct, (60*50+100)/61.0; got == nil || !near(float64(*got), want) {
		t.Fatalf("after a late sample: gpu_util_pct %v, want %v", got, want)
	}
}

// A summary behind the rollups by more than a read waits for (nothing
// keeping it, here no refresher) gives way to the figures computed by
// the read itself, which refreshes the small backlog first.
func TestCompareComputesWhenTheSummaryIsLongBehind(t *testing.T) {
	ctx := context.Background()
	a, b := newEnv(t), newEnv(t)
	a.write(summaryRun("big", 0, 700)...)
	a.write(endRec("big"))
	first, _ := compareOf(t, a, "big")
	a.write(summaryRun("big", 700, 1000)...)
	if _, err := storetest.Pool(t, a.s).Exec(ctx, `UPDATE rollup_dirty SET marked_at = now() - interval '1 minute' WHERE run_id = 'big'`); err != nil {
		t.Fatal(err)
	}
	got, lag := compareOf(t, a, "big")
	b.write(summaryRun("big", 0, 1000)...)
	b.write(endRec("big"))
	want, _ := compareOf(t, b, "big")
	if gj, wj := jsonOf(t, got), jsonOf(t, want); gj != wj || lag != "0" {
		t.Fatalf("a minute behind (lag %q):\n%s\nwant, computed from every step:\n%s", lag, gj, wj)
	}
	if jsonOf(t, got) == jsonOf(t, first) {
		t.Fatal("300 more steps changed nothing")
	}
	if s, err := a.s.RunSummary(ctx, "big"); err != nil || s == nil || !s.Current {
		t.Fatalf("summary after the read computed it: %+v, %v; want it stored, current", s, err)
	}
}
