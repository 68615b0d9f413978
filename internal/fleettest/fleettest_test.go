package fleettest

import (
	"math"
	"testing"
	"time"
)

// TestShapesShareTheAllReduce holds both shapes to one all-reduce: the
// wait each rank reports at a step is the same in the test shape and the
// bench shape (which rounds it as the hook does), and only the planted
// rank arrives last.
func TestShapesShareTheAllReduce(t *testing.T) {
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	run := Run{ID: "r", Ranks: 12, Steps: 5, Late: 4, Start: start}
	bench := Bench{ID: "r", Ranks: 12, Steps: 5, Late: 4, Start: start, GPUsPerNode: 8}
	var waits []float64
	for _, rec := range run.Records() {
		if rec["kind"] == "step" {
			waits = append(waits, rec["sync_wait_ms"].(float64))
		}
	}
	recs := bench.StepRecords(0, 5)
	if len(recs) != len(waits) {
		t.Fatalf("bench shape: %d step records, test shape %d", len(recs), len(waits))
	}
	for i, rec := range recs {
		s := rec.Step
		got, want := float64(*s.SyncWaitMS), math.Round(waits[i]*1e4)/1e4
		if got != want {
			t.Errorf("step %d rank %d: bench waits %g ms, test shape %g", *s.Step, s.Rank, got, want)
		}
		if late := s.Rank == 4; late != (got < 0.2+1e-9) {
			t.Errorf("step %d rank %d: waits %g ms; only rank 4 should arrive last", *s.Step, s.Rank, got)
		}
	}
}
