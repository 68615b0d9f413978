package query_test

import (
	"fmt"
	"testing"

	"github.com/deepseed/deepseed/api"
)

// commRun writes a run of two ranks whose steps carry total and exposed
// communication: collectives in flight 50 ms a step, mostly under the
// backward, of which rank 0's compute stream waited 12 ms and rank 1's 2.
func commRun(e *env, id string, steps int64) {
	recs := []api.Record{runRec(id, &api.RunMeta{WorldSize: api.Ptr(2)})}
	for rank := 0; rank < 2; rank++ {
		exposed := 12.0 - 10*float64(rank)
		for i := int64(0); i < steps; i++ {
			recs = append(recs, stepRec(id, rank, i, func(s *api.Step) {
				s.StepMS, s.ForwardMS, s.BackwardMS, s.OptimizerMS = api.F(80), api.F(20), api.F(40+10-exposed), api.F(5)
				s.DataMS, s.CommMS, s.CommExposedMS = api.F(3), api.F(50), api.F(exposed)
			}))
		}
	}
	e.write(recs...)
}

// The donut's communication is the time the compute stream waited, not
// the collectives' whole time, which overlaps the backward: the parts add
// up to the step, on raw rows and (past the raw budget) on rollups alike.
func TestBreakdownCommunicationIsTheExposedTime(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		id    string
		steps int64
	}{{"comm-small", 200}, {"comm-large", 3000}} {
		commRun(e, c.id, c.steps)
		for rank, exposed := range []float64{12, 2} {
			var b api.Breakdown
			e.get(fmt.Sprintf("/runs/%s/breakdown?rank=%d&from_step=100", c.id, rank), 200, &b)
			got := map[string]float64{}
			for _, p := range b.Parts {
				got[p.Name] = float64(p.MS)
			}
			want := map[string]float64{"forward": 20, "backward": 50 - exposed, "optimizer": 5, "communication": exposed,
				"data": 3, "other": 2}
			for k, v := range want {
				if !near(got[k], v) {
					t.Errorf("%s rank %d: %s %v ms, want %v (parts %v)", c.id, rank, k, got[k], v, got)
				}
			}
			if b.CommMS == nil || !near(float64(*b.CommMS), 50) {
				t.Errorf("%s rank %d: comm_ms %v, want 50", c.id, rank, b.CommMS)
			}
		}
	}
}

func TestCompareCarriesCommunication(t *testing.T) {
	e := newEnv(t)
	commRun(e, "cc1", 200)
	e.write(runRec("cc2", nil), stepRec("cc2", 0, 0, func(s *api.Step) { s.StepMS = api.F(80) }),
		stepRec("cc2", 0, 1, func(s *api.Step) { s.StepMS = api.F(80) }))
	var res api.CompareResponse
	e.get("/compare?run=cc1,cc2&baseline=cc1", 200, &res)
	if len(res.Rows) != 2 {
		t.Fatalf("rows: %+v", res.Rows)
	}
	for _, r := range res.Rows {
		switch r.RunID {
		case "cc1":
			if r.CommMS == nil || !near(float64(*r.CommMS), 50) || r.CommExposedMS == nil || !near(float64(*r.CommExposedMS), 7) {
				t.Errorf("cc1: comm_ms %v, comm_exposed_ms %v; want 50 and the ranks' mean 7", r.CommMS, r.CommExposedMS)
			}
			if r.Sources["comm_exposed_ms"] != api.SourceSteps {
				t.Errorf("cc1: sources %v", r.Sources)
			}
		case "cc2":
			if r.CommMS != nil || r.CommExposedMS != nil {
				t.Errorf("cc2 measured no communication, got %v and %v", r.CommMS, r.CommExposedMS)
			}
		}
	}
}
