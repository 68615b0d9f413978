package query_test

import (
	"testing"

	"github.com/deepseed/deepseed/api"
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
