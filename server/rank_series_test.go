package server

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// skewedLine is a step of a synchronous run of equal 100 ms steps whose
// rank arrives late ms after the first (true time) and whose host clock
// reads skew ms ahead; every rank leaves the collective together 2 ms
// after the last arrival (lastLate ms).
func skewedLine(run string, rank, step int, t0 time.Time, late, lastLate, skew float64) string {
	base := t0.Add(time.Duration(step) * 100 * time.Millisecond)
	arrival := base.UnixNano() + int64((late+skew)*1e6)
	wait := lastLate + 2 - late
	return fmt.Sprintf(`{"kind":"step","run_id":%q,"rank":%d,"step":%d,"time":%q,"loss":2.5,"step_ms":100,"sync_ns":%d,"sync_wait_ms":%g}`,
		run, rank, step, base.UTC().Format(time.RFC3339Nano), arrival, wait)
}

func getSeries(t *testing.T, r *running, run, query string) map[string]map[int]api.Series {
	t.Helper()
	code, b, _ := do(t, "GET", r.url+"/api/v1/runs/"+run+"/series?"+query, "", "")
	if code != 200 {
		t.Fatalf("GET series?%s = %d %s", query, code, b)
	}
	var sr api.SeriesResponse
	if err := json.Unmarshal(b, &sr); err != nil {
		t.Fatalf("series: %v: %s", err, b)
	}
	out := map[string]map[int]api.Series{}
	for _, s := range sr.Series {
		if out[s.Metric] == nil {
			out[s.Metric] = map[int]api.Series{}
		}
		out[s.Metric][s.Rank] = s
	}
	return out
}

// Four ranks, ranks 1 and 3 on a host whose clock is 40 ms ahead; rank 2
// starts arriving 30 ms late at step 50. The straggler score series of
// rank 2 is 0 before step 50 and then climbs as the EWMA of 30 ms over
// the others' 68 ms busy time; every other rank's stays 0. The lateness
// series shows the true lateness: the clock offsets are corrected as GET
// /runs/{id}/ranks estimates them, and its buckets average the steps.
func TestRankSeriesShowWhoStragglesSinceWhen(t *testing.T) {
	st := storetest.NewStore(t)
	cfg := testConfig()
	cfg.AlertsEvery = 100 * time.Millisecond
	r := start(t, New(cfg, st, testLogger(t)))
	const run = "late-from-50"
	const steps, from50, late2 = 100, 50, 30.0
	skew := map[int]float64{1: 40, 3: 40}
	trueLate := func(rank, step int) float64 {
		if rank == 2 && step >= from50 {
			return late2
		}
		return 0
	}
	t0 := time.Now().Add(-time.Minute)
	// Chunks of ten steps, each scored before the next arrives: the
	// evaluator scores the newest steps and continues its series.
	for lo := 1; lo <= steps; lo += 10 {
		var lines []string
		for step := lo; step < lo+10; step++ {
			for rank := range 4 {
				lines = append(lines, skewedLine(run, rank, step, t0, trueLate(rank, step), trueLate(2, step), skew[rank]))
			}
		}
		ingestLines(t, r, lines)
		hi := int64(lo + 9)
		// Scores the evaluator stored, not the series a read computes for
		// steps it has not scored yet: a loaded machine's evaluator may come
		// late, and its first pass scores only the newest window.
		waitFor(t, fmt.Sprintf("scores stored up to step %d", hi), func() bool {
			last, err := st.LastRankScores(context.Background(), run)
			if err != nil || len(last) != 4 {
				return false
			}
			for _, s := range last {
				if s.Step != hi {
					return false
				}
			}
			return true
		})
	}

	all := getSeries(t, r, run, "metric=straggler_score&metric=lateness_ms&rank=all")
	// The score, computed here: an EWMA (weight 0.1) of lateness over the
	// median busy time of the step (68 ms: 100 less the others' 32 ms wait).
	wantScore := func(rank, step int) float64 {
		if rank != 2 || step < from50 {
			return 0
		}
		return late2 / 68 * (1 - math.Pow(0.9, float64(step-from50+1)))
	}
	for rank := range 4 {
		s := all["straggler_score"][rank]
		if s.Unit != "ratio" || s.BucketSteps != 1 || len(s.Points) != steps {
			t.Fatalf("rank %d score series: unit %q, bucket %d, %d points; want ratio, 1, %d", rank, s.Unit, s.BucketSteps, len(s.Points), steps)
		}
		for i, p := range s.Points {
			step := i + 1
			// Stored as spans within store.ScoreEpsilon of the scores.
			if p.Step != int64(step) || p.Count != 1 || math.Abs(float64(p.Value)-wantScore(rank, step)) > store.ScoreEpsilon {
				t.Fatalf("rank %d score at step %d: %+v, want %.6f", rank, step, p, wantScore(rank, step))
			}
		}
	}
	s2 := all["straggler_score"][2].Points
	// Zero, or within rounding of it where the score was computed on read
	// (before the evaluator stored its own, from the whole run's clock
	// offsets).
	if v := float64(s2[from50-2].Value); math.Abs(v) > 1e-5 {
		t.Errorf("rank 2 score before step %d: %v, want 0", from50, v)
	}
	for i := from50; i < steps; i++ {
		if s2[i].Value <= s2[i-1].Value {
			t.Fatalf("rank 2 score does not rise after step %d: %v then %v", from50, s2[i-1].Value, s2[i].Value)
		}
	}
	if v := float64(s2[steps-1].Value); v < 0.1 {
		t.Errorf("rank 2 score at step %d is %v: below the alert's 10 %%", steps, v)
	}

	for rank := range 4 {
		s := all["lateness_ms"][rank]
		if s.Unit != "ms" || len(s.Points) != steps {
			t.Fatalf("rank %d lateness: unit %q, %d points", rank, s.Unit, len(s.Points))
		}
		for i, p := range s.Points {
			if want := trueLate(rank, i+1); math.Abs(float64(p.Value)-want) > 1e-3 {
				t.Fatalf("rank %d lateness at step %d: %v, want %v (clock offset %v ms not corrected?)", rank, i+1, p.Value, want, skew[rank])
			}
		}
	}
	// The offsets are the ones the ranks endpoint shows.
	code, b, _ := do(t, "GET", r.url+"/api/v1/runs/"+run+"/ranks", "", "")
	var rk api.RanksResponse
	if code != 200 || json.Unmarshal(b, &rk) != nil || len(rk.Ranks) != 4 {
		t.Fatalf("GET /ranks = %d %s", code, b)
	}
	// The newest score is the one the evaluator computed, exactly: the
	// ranks' heads (the evaluator's clock offsets, estimated over its
	// window, move it by rounding from the score computed here).
	heads, err := st.LastRankScores(context.Background(), run)
	if err != nil || len(heads) != 4 {
		t.Fatalf("heads: %v, %v", heads, err)
	}
	for _, s := range rk.Ranks {
		h := heads[s.Rank]
		if s.StragglerScore == nil {
			t.Errorf("rank %d: no straggler score", s.Rank)
		} else if float64(*s.StragglerScore) != h.Score || math.Abs(h.Score-wantScore(s.Rank, steps)) > 1e-5 {
			t.Errorf("rank %d straggler score %v, want the head's %v (%.6f)", s.Rank, *s.StragglerScore, h.Score, wantScore(s.Rank, steps))
		}
		if s.ClockOffsetMS == nil || math.Abs(float64(*s.ClockOffsetMS)-skew[s.Rank]) > 1e-3 {
			t.Errorf("rank %d clock offset %v, want %v", s.Rank, s.ClockOffsetMS, skew[s.Rank])
		}
	}

	// Downsampled: each bucket is the mean of its steps' lateness, with
	// their extremes; one rank alone gives the same buckets.
	for _, q := range []string{"metric=lateness_ms&rank=all&max_points=10", "metric=lateness_ms&rank=2&max_points=10"} {
		ds := getSeries(t, r, run, q)["lateness_ms"][2]
		if w := ds.BucketSteps; w < 10 || len(ds.Points) > 10 || len(ds.Points) == 0 {
			t.Fatalf("%s: bucket of %d steps, %d points", q, w, len(ds.Points))
		}
		w := int(ds.BucketSteps)
		for _, p := range ds.Points {
			lo := max(1, int(p.Step)/w*w)
			hi := min(steps, lo/w*w+w-1)
			var sum, mn, mx float64 = 0, math.Inf(1), math.Inf(-1)
			for st := lo; st <= hi; st++ {
				v := trueLate(2, st)
				sum += v
				mn, mx = math.Min(mn, v), math.Max(mx, v)
			}
			n := hi - lo + 1
			if p.Step != int64(lo) || p.Count != int64(n) || math.Abs(float64(p.Value)-sum/float64(n)) > 1e-3 ||
				math.Abs(float64(p.Min)-mn) > 1e-3 || math.Abs(float64(p.Max)-mx) > 1e-3 {
				t.Errorf("%s: bucket %+v, want steps %d–%d: mean %v, min %v, max %v", q, p, lo, hi, sum/float64(n), mn, mx)
			}
		}
	}
	// A step range narrows the lateness and keeps the offsets.
	nr := getSeries(t, r, run, "metric=lateness_ms&rank=1&from_step=60&to_step=64")["lateness_ms"][1]
	if len(nr.Points) != 5 || nr.Points[0].Step != 60 || math.Abs(float64(nr.Points[0].Value)) > 1e-3 {
		t.Errorf("rank 1 lateness over steps 60–64: %+v", nr.Points)
	}
}

// A run of one rank has no lateness and no score: empty series, not an
// error.
func TestRankSeriesOfOneRank(t *testing.T) {
	r := alertServer(t)
	t0 := time.Now().Add(-time.Minute)
	var lines []string
	for step := 1; step <= 20; step++ {
		lines = append(lines, skewedLine("solo", 0, step, t0, 0, 0, 0))
	}
	ingestLines(t, r, lines)
	got := getSeries(t, r, "solo", "metric=lateness_ms&metric=straggler_score")
	for _, m := range []string{"lateness_ms", "straggler_score"} {
		if s, ok := got[m][0]; !ok || len(s.Points) != 0 {
			t.Errorf("%s of a one-rank run: %+v", m, got[m])
		}
	}
}
