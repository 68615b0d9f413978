package server

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// A run past the raw-row budget of the per-rank views: 40 ranks on five
// hosts of 8 GPUs, 700 steps, rank 13 arriving 20 ms late at every step.
// /ranks reads the rollups and says so, and tells the same story as the
// row-by-row path over a range small enough for it; rank=all answers the
// ranks' distribution and the straggler's own series; the summary's
// straggler GPU-hours are the waits the straggler caused.
func TestRanksAndSeriesOfManyRanks(t *testing.T) {
	cfg := testConfig()
	r := start(t, New(cfg, storetest.NewStore(t), testLogger(t)))
	waitFor(t, "readyz", func() bool { code, _, _ := do(t, "GET", r.url+"/readyz", "", ""); return code == 200 })
	const run, ranks, steps, late, straggler = "fleet", 40, 700, 20.0, 13
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	host := func(rank int) string { return fmt.Sprintf("node-%d", rank/8) }
	for from := 0; from < steps; from += 100 {
		var lines []string
		for step := from; step < from+100; step++ {
			for rank := range ranks {
				l := 0.0
				if rank == straggler {
					l = late
				}
				lines = append(lines, syncLine(run, rank, step, t0, l, late))
			}
		}
		// One GPU sample a rank says where it runs.
		for rank := range ranks {
			lines = append(lines, fmt.Sprintf(`{"kind":"gpu","time":%q,"host":%q,"gpu":%d,"run_id":%q,"rank":%d,"util_pct":95}`,
				t0.Add(time.Duration(from)*100*time.Millisecond).UTC().Format(time.RFC3339Nano), host(rank), rank%8, run, rank))
		}
		ingestLines(t, r, lines)
	}
	waitRollups(t, r, run)

	// Reads answer whatever the rollup backlog: wait for the run's rollups
	// before reading them.
	waitFor(t, "the run's rollups", func() bool {
		code, b, _ := do(t, "GET", r.url+"/api/v1/runs/"+run, "", "")
		var lag struct {
			RollupLag *json.RawMessage `json:"rollup_lag"`
		}
		return code == 200 && json.Unmarshal(b, &lag) == nil && lag.RollupLag == nil
	})
	getRanks := func(query string) api.RanksResponse {
		t.Helper()
		code, b, _ := do(t, "GET", r.url+"/api/v1/runs/"+run+"/ranks?"+query, "", "")
		var rk api.RanksResponse
		if code != 200 || json.Unmarshal(b, &rk) != nil {
			t.Fatalf("GET /ranks?%s = %d %s", query, code, b)
		}
		if len(rk.Ranks) != ranks {
			t.Fatalf("GET /ranks?%s: %d ranks, want %d", query, len(rk.Ranks), ranks)
		}
		return rk
	}
	big := getRanks("from_step=0")
	if big.Basis != "rollups" || big.FromStep != 0 || big.LatenessFrom != "arrivals" {
		t.Fatalf("whole run: basis %q from %d lateness from %q; want rollups from 0, arrivals (%d rank-steps > %d)",
			big.Basis, big.FromStep, big.LatenessFrom, ranks*steps, store.ExactRankRows)
	}
	// 100 steps x 40 ranks fit the budget: the same figures row by row.
	small := getRanks("from_step=600")
	if small.Basis != "steps" {
		t.Fatalf("from step 600: basis %q, want steps", small.Basis)
	}
	for i, s := range big.Ranks {
		e := small.Ranks[i]
		if s.Rank != e.Rank || s.Host != host(s.Rank) || s.Steps != steps {
			t.Errorf("rank %d: host %q steps %d, want %q and %d", s.Rank, s.Host, s.Steps, host(s.Rank), steps)
		}
		for name, pair := range map[string][2]*api.Float{"lateness": {s.LatenessMS, e.LatenessMS}, "busy": {s.BusyMS, e.BusyMS},
			"sync wait": {s.SyncWaitMS, e.SyncWaitMS}, "last pct": {s.LastPct, e.LastPct}} {
			if pair[0] == nil || pair[1] == nil || math.Abs(float64(*pair[0]-*pair[1])) > 1e-3 {
				t.Errorf("rank %d %s: rollups %v, rows %v", s.Rank, name, pair[0], pair[1])
			}
		}
		if s.Straggler != (s.Rank == straggler) || e.Straggler != (s.Rank == straggler) {
			t.Errorf("rank %d straggler: rollups %v, rows %v", s.Rank, s.Straggler, e.Straggler)
		}
		if float64(s.MedianStepMS) != 100 || !math.IsNaN(float64(s.P95StepMS)) {
			t.Errorf("rank %d: median step %v p95 %v; want the mean 100 and no p95 from rollups", s.Rank, s.MedianStepMS, s.P95StepMS)
		}
	}
	if len(big.Hosts) != ranks/8 {
		t.Fatalf("%d hosts, want %d: %+v", len(big.Hosts), ranks/8, big.Hosts)
	}
	if h := big.Hosts[0]; h.Host != host(straggler) || h.WorstRank != straggler || h.Stragglers != 1 || h.Ranks != 8 ||
		h.MaxLatenessMS == nil || math.Abs(float64(*h.MaxLatenessMS)-late) > 1e-3 {
		t.Errorf("slowest host %+v; want %s with rank %d, %v ms late", h, host(straggler), straggler, late)
	}

	// rank=all: the distribution, the top ranks by lateness, rank 5 named;
	// at 7 points the stored spread of 100-step buckets.
	code, b, _ := do(t, "GET", r.url+"/api/v1/runs/"+run+"/series?metric=lateness_ms&rank=all&rank=5&top=2&max_points=7", "", "")
	var sr api.SeriesResponse
	if code != 200 || json.Unmarshal(b, &sr) != nil {
		t.Fatalf("series rank=all = %d %s", code, b)
	}
	if sr.Ranks != ranks || len(sr.Spread) != 1 || sr.Notice == "" {
		t.Fatalf("series rank=all: ranks %d, %d spreads, notice %q", sr.Ranks, len(sr.Spread), sr.Notice)
	}
	sp := sr.Spread[0]
	if sp.BucketSteps < 100 || len(sp.Points) != steps/int(sp.BucketSteps) {
		t.Fatalf("spread: %d points of %d steps for %d steps", len(sp.Points), sp.BucketSteps, steps)
	}
	for _, p := range sp.Points {
		if p.Ranks != ranks || p.MaxRank != straggler || math.Abs(float64(p.Max)-late) > 1e-3 ||
			math.Abs(float64(p.Median)) > 1e-3 || math.Abs(float64(p.Mean)-late/ranks) > 1e-3 {
			t.Errorf("spread point %+v; want %d ranks, rank %d highest at %v, median 0, mean %v", p, ranks, straggler, late, late/ranks)
		}
	}
	got := map[int]bool{}
	for _, s := range sr.Series {
		got[s.Rank] = true
		if len(s.Points) != len(sp.Points) {
			t.Errorf("rank %d: %d points, the spread has %d", s.Rank, len(s.Points), len(sp.Points))
		}
	}
	if len(sr.Series) != 3 || !got[straggler] || !got[5] {
		t.Errorf("series of ranks %v; want the straggler %d, one more top rank and rank 5", got, straggler)
	}
	checkFineSpread(t, r.url, run, ranks, straggler, late)
	for _, q := range []string{"rank=all&rank=x", "rank=all&top=17", "rank=-1"} {
		if code, b, _ := do(t, "GET", r.url+"/api/v1/runs/"+run+"/series?metric=step_ms&"+q, "", ""); code != 400 {
			t.Errorf("series?%s = %d %s, want 400", q, code, b)
		}
	}

	// Every other rank waited 20 ms past the straggler's wait at each step.
	code, b, _ = do(t, "GET", r.url+"/api/v1/runs/"+run, "", "")
	var d api.RunDetail
	if code != 200 || json.Unmarshal(b, &d) != nil {
		t.Fatalf("GET /runs/%s = %d %s", run, code, b)
	}
	want := float64(steps*(ranks-1)) * late / 3.6e6
	if math.Abs(float64(d.Wasted.Straggler)-want) > 1e-9 || d.Steps != steps {
		t.Errorf("straggler GPU-hours %v over %d steps, want %v over %d", d.Wasted.Straggler, d.Steps, want, steps)
	}
}

// checkFineSpread checks rank=all of a range too short for the stored
// spread's 100-step buckets: its distribution is computed step by step,
// as the stored one is (the straggler highest at late ms, the median 0),
// its x range the range asked; the straggler score, which has no
// rollups, gets a distribution too, the straggler among its top ranks.
func checkFineSpread(t *testing.T, base, run string, ranks, straggler int, late float64) {
	t.Helper()
	get := func(q string) api.SeriesResponse {
		t.Helper()
		code, b, _ := do(t, "GET", base+"/api/v1/runs/"+run+"/series?"+q, "", "")
		var sr api.SeriesResponse
		if code != 200 || json.Unmarshal(b, &sr) != nil {
			t.Fatalf("series?%s = %d %s", q, code, b)
		}
		return sr
	}
	sr := get("metric=lateness_ms&metric=step_ms&rank=all&from_step=600&to_step=699&top=1")
	if len(sr.Spread) != 2 || !strings.Contains(sr.Notice, "step by step") {
		t.Fatalf("steps 600-699: %d spreads, notice %q; want two, step by step", len(sr.Spread), sr.Notice)
	}
	for _, sp := range sr.Spread {
		if sp.BucketSteps != 1 || len(sp.Points) != 100 || sp.Points[0].Step != 600 || sp.Points[99].Step != 699 {
			t.Fatalf("%s: %d points of %d steps: want 100 single steps from 600 to 699", sp.Metric, len(sp.Points), sp.BucketSteps)
		}
	}
	for _, p := range sr.Spread[0].Points {
		if p.Ranks != ranks || p.MaxRank != straggler || math.Abs(float64(p.Max)-late) > 1e-3 || math.Abs(float64(p.Median)) > 1e-3 ||
			math.Abs(float64(p.P95)) > 1e-3 {
			t.Errorf("lateness at step %d: %+v; want %d ranks, rank %d highest at %v, p95 and median 0", p.Step, p, ranks, straggler, late)
		}
	}
	for _, p := range sr.Spread[1].Points {
		if float64(p.Min) != 100 || float64(p.Max) != 100 || float64(p.Median) != 100 {
			t.Errorf("step time at step %d: %+v; want every rank at 100 ms", p.Step, p)
		}
	}
	if len(sr.Series) != 2 || sr.Series[0].Rank != straggler || len(sr.Series[0].Points) != 100 {
		t.Errorf("series %+v; want the straggler's lateness and step time, 100 points each", sr.Series)
	}

	sc := get("metric=straggler_score&rank=all&top=2")
	if len(sc.Spread) != 1 || len(sc.Spread[0].Points) == 0 {
		t.Fatalf("straggler score: spreads %+v, notice %q; want its distribution", sc.Spread, sc.Notice)
	}
	last := sc.Spread[0].Points[len(sc.Spread[0].Points)-1]
	if last.MaxRank != straggler || !(float64(last.Max) > 0.1) || float64(last.Median) > 0.01 {
		t.Errorf("last score bucket %+v; want rank %d highest, the others near 0", last, straggler)
	}
	if len(sc.Series) != 2 || sc.Series[0].Rank != straggler {
		t.Errorf("score series of ranks %+v; want the straggler's first", sc.Series)
	}
}
