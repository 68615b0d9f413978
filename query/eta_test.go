package query_test

import (
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// A running run with known total steps shows the time it has left: the
// steps left times its steady mean step time; a finished one, one whose
// total is unknown, or one silent for longer than the stall alert's limit
// (its steps written at t0, months ago), shows none.
func TestRunETA(t *testing.T) {
	e := newEnv(t)
	// The runs but "silent" post their last step a minute ago.
	start := time.Now().Add(-200*time.Second - time.Minute)
	recent := func(r api.Record) api.Record {
		switch {
		case r.Run != nil && r.Run.RunID != "silent":
			r.Run.StartedAt = api.T(start)
		case r.Step != nil && r.Step.RunID != "silent":
			r.Step.Time = api.T(start.Add(time.Duration(*r.Step.Step) * time.Second))
		}
		return r
	}
	recs := []api.Record{runRec("eta", &api.RunMeta{TotalSteps: api.Ptr(int64(1000))}), runRec("noeta", nil),
		runRec("done", &api.RunMeta{TotalSteps: api.Ptr(int64(1000))}), runRec("silent", &api.RunMeta{TotalSteps: api.Ptr(int64(1000))})}
	stepMS := func(i int64) float64 {
		if i < 10 {
			return 3000 // warm-up: compilation, first allocations
		}
		return 400 + float64(i%5)*50
	}
	for _, id := range []string{"eta", "noeta", "done", "silent"} {
		for i := int64(1); i <= 200; i++ {
			recs = append(recs, stepRec(id, 0, i, func(s *api.Step) { s.StepMS = api.F(stepMS(i)) }))
		}
	}
	for i := range recs {
		recs[i] = recent(recs[i])
	}
	recs = append(recs, api.Record{End: &api.End{Kind: "end", RunID: "done", Time: api.T(start.Add(time.Hour)), Status: api.StatusFinished}})
	e.write(recs...)

	var bd api.Breakdown
	e.get("/runs/eta/breakdown", 200, &bd)
	if bd.FromStep < 10 {
		t.Fatalf("steady state from step %d, inside the warm-up", bd.FromStep)
	}
	sum, n := 0.0, 0
	for i := bd.FromStep; i <= 200; i++ {
		sum += stepMS(i)
		n++
	}
	want := float64(1000-200) * sum / float64(n) / 1000

	var d api.RunDetail
	e.get("/runs/eta", 200, &d)
	if d.TotalSteps == nil || *d.TotalSteps != 1000 || d.ETASeconds == nil || !near(float64(*d.ETASeconds), want) {
		t.Fatalf("eta: total %v, eta_s %v, want %v", d.TotalSteps, d.ETASeconds, want)
	}
	if d.ETAAt == nil || d.LastSeenAt == nil || !near(d.ETAAt.Sub(*d.LastSeenAt).Seconds(), want) {
		t.Errorf("eta_at %v, last seen %v", d.ETAAt, d.LastSeenAt)
	}
	for _, id := range []string{"noeta", "done", "silent"} {
		e.get("/runs/"+id, 200, &d)
		if d.ETASeconds != nil || d.ETAAt != nil {
			t.Errorf("%s: eta %v at %v", id, d.ETASeconds, d.ETAAt)
		}
	}
}
