package fleettest

import (
	"math"
	"slices"
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

// TestLoadShape holds the ingest benchmark's shape: a step and a layers
// record per rank and step, an evaluation every EvalEvery steps from step
// 0, and the seed's layer names.
func TestLoadShape(t *testing.T) {
	l := Load{RunID: "load", Ranks: 3, Layers: 4, EvalEvery: 10, Start: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	if got := l.LayerNames(); len(got) != 4 || got[0] != "embeddings" || got[1] != "encoder.0" || got[3] != "classifier" {
		t.Fatalf("layer names %v", got)
	}
	recs := l.Records(5, 20) // steps 5..24: evaluations at 10 and 20
	steps, layers, evals := 0, 0, 0
	for _, r := range recs {
		switch {
		case r.Step != nil:
			steps++
		case r.Layers != nil:
			layers++
			if len(r.Layers.ForwardMS) != 4 || len(r.Layers.BackwardMS) != 4 {
				t.Errorf("layers record of step %d: %d and %d timings", *r.Layers.Step, len(r.Layers.ForwardMS), len(r.Layers.BackwardMS))
			}
		case r.Eval != nil:
			evals++
			if *r.Eval.Step%10 != 0 {
				t.Errorf("evaluation at step %d", *r.Eval.Step)
			}
		}
	}
	if steps != 60 || layers != 60 || evals != 2 {
		t.Errorf("%d step, %d layers, %d eval records; want 60, 60, 2", steps, layers, evals)
	}
}

// TestGenRunIsSeeded holds the store's shape to its seed: the same run
// gives the same lines, another seed others, and with a period the
// layers come every Period steps only.
func TestGenRunIsSeeded(t *testing.T) {
	g := GenRun{ID: "g", Ranks: 2, Steps: 40, Start: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), Every: time.Second, Seed: 1, Layers: 2, Period: 10}
	a, b := g.StepLines(1, 0, 40, 0), g.StepLines(1, 0, 40, 0)
	if len(a) != 44 || !slices.Equal(a, b) {
		t.Fatalf("%d and %d lines, equal %v; want 40 steps and 4 layers records, twice the same", len(a), len(b), slices.Equal(a, b))
	}
	g.Seed = 2
	if slices.Equal(a, g.StepLines(1, 0, 40, 0)) {
		t.Error("another seed gave the same lines")
	}
}
