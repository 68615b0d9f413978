package query_test

import (
	"context"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/query"
	"github.com/deepseed/deepseed/store"
)

// A finished run the alert evaluator never saw (yesterday's, or an
// imported one) still shows each rank's straggler score on GET
// /runs/{id}/ranks, computed from its records as the evaluator computes
// it live: rank 1, which reaches every all-reduce 30 ms after rank 0,
// scores 30 ms over the 100 ms median busy time; rank 0 scores nothing.
func TestRanksScoreAFinishedRunAfterTheFact(t *testing.T) {
	e := newEnv(t)
	recs := []api.Record{runRec("ddp-late", nil)}
	const stepNS = int64(200e6)
	for step := int64(1); step <= 60; step++ {
		for rank, late := range []float64{0, 30} {
			arrival := int64(1.7e18) + step*stepNS + int64(late*1e6)
			wait := 30 - late // rank 0 waits for rank 1
			recs = append(recs, stepRec("ddp-late", rank, step, func(s *api.Step) {
				s.StepMS = api.F(100 + wait)
				s.SyncNS = api.Ptr(arrival)
				s.SyncWaitMS = api.F(wait)
			}))
		}
	}
	recs = append(recs, api.Record{End: &api.End{Kind: "end", RunID: "ddp-late", Time: api.T(t0.Add(61e9)), Status: "finished"}})
	e.write(recs...)

	var res api.RanksResponse
	e.get("/runs/ddp-late/ranks", 200, &res)
	if len(res.Ranks) != 2 {
		t.Fatalf("ranks %+v", res.Ranks)
	}
	score := map[int]float64{}
	for _, r := range res.Ranks {
		if r.StragglerScore == nil {
			t.Fatalf("rank %d has no straggler score: %+v", r.Rank, r)
		}
		score[r.Rank] = float64(*r.StragglerScore)
	}
	if score[0] != 0 || score[1] < 0.29 || score[1] > 0.31 {
		t.Errorf("scores %v, want rank 0 at 0 and rank 1 at 30 ms / 100 ms = 0.3", score)
	}
	if !res.Ranks[1].Straggler || res.Ranks[0].Straggler {
		t.Errorf("flags %v %v: want rank 1 alone flagged", res.Ranks[0].Straggler, res.Ranks[1].Straggler)
	}
}

// The same run's straggler score by step (the Ranks dashboard's chart),
// also computed from its records: rank 1's line rises towards 0.3 and
// ends at the score GET /runs/{id}/ranks gives; rank 0's stays at 0.
func TestStragglerScoreSeriesAfterTheFact(t *testing.T) {
	e := newEnv(t)
	writeLateRank(e, 60)

	var res api.SeriesResponse
	e.get("/runs/ddp-late/series?metric=straggler_score&rank=all&x_axis=step", 200, &res)
	byRank := map[int][]api.Point{}
	for _, s := range res.Series {
		byRank[s.Rank] = s.Points
	}
	if len(byRank[0]) < 50 || len(byRank[1]) < 50 {
		t.Fatalf("points by rank: %d and %d, want one a step", len(byRank[0]), len(byRank[1]))
	}
	for _, p := range byRank[0] {
		if float64(p.Value) != 0 {
			t.Fatalf("rank 0 scores %v at step %d, want 0", p.Value, p.Step)
		}
	}
	one := byRank[1]
	first, last := float64(one[0].Value), float64(one[len(one)-1].Value)
	if !(first < last) || last < 0.29 || last > 0.31 {
		t.Errorf("rank 1 from %v to %v, want rising to 0.3", first, last)
	}
}

// A run the evaluator began watching late (a server started during the
// run) has scores stored from its first pass on, over the steps it read
// then: the steps before them get theirs computed on read, so the chart
// still covers the whole run, and the stored scores stand where they are.
func TestStragglerScoreSeriesBeforeTheStoredOnes(t *testing.T) {
	e := newEnv(t)
	writeLateRank(e, 60)
	storeLateRankScores(e, 31, 60)

	var res api.SeriesResponse
	e.get("/runs/ddp-late/series?metric=straggler_score&rank=all&x_axis=step", 200, &res)
	for _, s := range res.Series {
		if len(s.Points) != 60 {
			t.Fatalf("rank %d: %d points, want one a step of 60", s.Rank, len(s.Points))
		}
		for _, p := range s.Points {
			v := float64(p.Value)
			switch {
			case s.Rank == 0 && v != 0:
				t.Fatalf("rank 0 scores %v at step %d, want 0", v, p.Step)
			case s.Rank == 1 && p.Step >= 31 && v != 0.5:
				t.Fatalf("rank 1 at step %d: %v, want the stored 0.5", p.Step, v)
			case s.Rank == 1 && p.Step < 31 && (v <= 0 || v > 0.31):
				t.Fatalf("rank 1 at step %d: %v, want its computed score, up to 30 ms / 100 ms = 0.3", p.Step, v)
			}
		}
	}
	if len(res.Series) != 2 {
		t.Fatalf("%d series, want one a rank", len(res.Series))
	}
}

// The evaluator scores a live run every few seconds: the steps written
// since its last pass have no stored score yet. They get theirs computed
// on read as its next pass will store them, each rank's EWMA continued
// from its stored score, so the chart runs to the run's last step: rank 1,
// stored at 0.5, falls toward its 30 ms / 100 ms = 0.3 step by step, and
// rank 0 stays at 0.
func TestStragglerScoreSeriesAfterTheStoredOnes(t *testing.T) {
	e := newEnv(t)
	writeLateRank(e, 60)
	storeLateRankScores(e, 1, 40)

	var res api.SeriesResponse
	e.get("/runs/ddp-late/series?metric=straggler_score&rank=all&x_axis=step", 200, &res)
	if len(res.Series) != 2 {
		t.Fatalf("%d series, want one a rank", len(res.Series))
	}
	for _, s := range res.Series {
		if len(s.Points) != 60 || s.Points[59].Step != 60 {
			t.Fatalf("rank %d: %d points, want one a step to step 60", s.Rank, len(s.Points))
		}
		for i, p := range s.Points {
			v := float64(p.Value)
			switch {
			case s.Rank == 0 && v != 0:
				t.Fatalf("rank 0 scores %v at step %d, want 0", v, p.Step)
			case s.Rank == 1 && p.Step <= 40 && v != 0.5:
				t.Fatalf("rank 1 at step %d: %v, want the stored 0.5", p.Step, v)
			case s.Rank == 1 && p.Step > 40 && !(v > 0.3 && v < float64(s.Points[i-1].Value)):
				t.Fatalf("rank 1 at step %d: %v after %v, want it falling from the stored 0.5 toward 0.3", p.Step, v, s.Points[i-1].Value)
			}
		}
	}
}

// Past the row budget (many ranks × steps) the scores come from the
// rollups of lateness and busy time, a block of 100 steps an update: the
// same story, rank 1 at 0.3 and rank 0 at 0, from a few rows a rank.
func TestStragglerScoreSeriesFromRollups(t *testing.T) {
	e := newEnv(t)
	writeLateRank(e, 400)
	defer query.SetScoreRowBudget(10)()

	var res api.SeriesResponse
	e.get("/runs/ddp-late/series?metric=straggler_score&rank=all&x_axis=step", 200, &res)
	last := map[int]float64{}
	points := 0
	for _, s := range res.Series {
		points += len(s.Points)
		if len(s.Points) > 0 {
			last[s.Rank] = float64(s.Points[len(s.Points)-1].Value)
		}
	}
	if points == 0 || points > 2*5 {
		t.Fatalf("%d points, want one a rank a block of 100 steps", points)
	}
	if last[0] != 0 || last[1] < 0.29 || last[1] > 0.31 {
		t.Errorf("final scores %v, want rank 1 at 0.3 and rank 0 at 0", last)
	}
}

// storeLateRankScores stores, as the evaluator would, the straggler
// scores of writeLateRank's run for steps from to to: 0 for rank 0, 0.5
// for rank 1.
func storeLateRankScores(e *env, from, to int64) {
	e.t.Helper()
	var stored []store.RankScore
	for step := from; step <= to; step++ {
		for rank, score := range []float64{0, 0.5} {
			stored = append(stored, store.RankScore{Rank: rank, Step: step, Time: t0.Add(time.Duration(step) * time.Second), Score: score})
		}
	}
	if err := e.s.AddRankScores(context.Background(), "ddp-late", stored); err != nil {
		e.t.Fatal(err)
	}
}

// writeLateRank writes a finished two-rank run of n steps whose rank 1
// reaches every all-reduce 30 ms after rank 0 (100 ms busy each).
func writeLateRank(e *env, n int64) {
	recs := []api.Record{runRec("ddp-late", nil)}
	const stepNS = int64(200e6)
	for step := int64(1); step <= n; step++ {
		for rank, late := range []float64{0, 30} {
			arrival := int64(1.7e18) + step*stepNS + int64(late*1e6)
			wait := 30 - late
			recs = append(recs, stepRec("ddp-late", rank, step, func(s *api.Step) {
				s.StepMS = api.F(100 + wait)
				s.SyncNS = api.Ptr(arrival)
				s.SyncWaitMS = api.F(wait)
			}))
		}
	}
	recs = append(recs, api.Record{End: &api.End{Kind: "end", RunID: "ddp-late", Time: api.T(t0.Add(time.Duration(n+1) * time.Second)), Status: "finished"}})
	e.write(recs...)
}

// A run of more ranks than get a line each, which the evaluator began
// watching late: its straggler score comes as the distribution over the
// ranks, and the steps before the stored scores are computed on read
// step by step, as the distribution of every other metric of that many
// rank-steps is, not folded into blocks of 100 steps: the band runs one
// point a step over the whole run, the late rank's the highest.
func TestStragglerScoreSpreadBeforeTheStoredOnes(t *testing.T) {
	e := newEnv(t)
	const ranks, steps, late = api.MaxRankSeries + 4, 60, 7
	const stepNS = int64(200e6)
	recs := []api.Record{runRec("wide-late", nil)}
	for step := int64(1); step <= steps; step++ {
		for rank := 0; rank < ranks; rank++ {
			lateMS := 0.0
			if rank == late {
				lateMS = 30
			}
			arrival := int64(1.7e18) + step*stepNS + int64(lateMS*1e6)
			recs = append(recs, stepRec("wide-late", rank, step, func(s *api.Step) {
				s.StepMS = api.F(130 - lateMS)
				s.SyncNS = api.Ptr(arrival)
				s.SyncWaitMS = api.F(30 - lateMS)
			}))
		}
	}
	e.write(recs...)
	var stored []store.RankScore
	for step := int64(31); step <= steps; step++ {
		for rank := 0; rank < ranks; rank++ {
			score := 0.0
			if rank == late {
				score = 0.3
			}
			stored = append(stored, store.RankScore{Rank: rank, Step: step, Time: t0.Add(time.Duration(step) * time.Second), Score: score})
		}
	}
	if err := e.s.AddRankScores(context.Background(), "wide-late", stored); err != nil {
		t.Fatal(err)
	}
	// A few ranks' lines of that many steps would come from the rollups.
	defer query.SetScoreRowBudget(10)()

	var res api.SeriesResponse
	e.get("/runs/wide-late/series?metric=straggler_score&rank=all&x_axis=step", 200, &res)
	if len(res.Spread) != 1 {
		t.Fatalf("spread %+v: want the score's distribution over %d ranks", res.Spread, ranks)
	}
	pts := res.Spread[0].Points
	if len(pts) < steps/2+10 || pts[len(pts)-1].Step != steps {
		t.Fatalf("%d points of the band, the last at step %d: want one a step from before step 31 to step %d", len(pts), pts[len(pts)-1].Step, steps)
	}
	for i, p := range pts {
		if i > 0 && p.Step != pts[i-1].Step+1 {
			t.Fatalf("band steps %d then %d: want one a step", pts[i-1].Step, p.Step)
		}
		if p.MaxRank != late || float64(p.Max) <= 0 || float64(p.Max) > 0.31 || float64(p.Median) != 0 {
			t.Fatalf("band at step %d: max %v by rank %d, median %v; want rank %d highest, up to 0.3, the median at 0", p.Step, p.Max, p.MaxRank, p.Median, late)
		}
	}
}
