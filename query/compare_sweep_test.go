package query_test

import (
	"strings"
	"testing"

	"github.com/deepseed/deepseed/api"
)

// Every compare row of a sweep, read with the sweep's other trials, is
// the row of that run compared alone, field by field, whatever its
// shape: finished with evaluations and GPU samples, running with GPU
// samples only, running on ranks not starting at 0, without steps.
func TestCompareSweepRowsAreTheRunsOwnRows(t *testing.T) {
	e := newEnv(t)
	summaryShapes(e)
	// A first read refreshes every rollup and stores every summary: both
	// reads then see the same.
	e.get("/compare?sweep=sw", 200, nil)
	var sweep api.CompareResponse
	e.get("/compare?sweep=sw&baseline="+api.BaselineFirst, 200, &sweep)
	seen := map[string]api.CompareRow{}
	for _, row := range sweep.Rows {
		var own api.CompareResponse
		e.get("/compare?run="+row.RunID+"&baseline="+sweep.Baseline, 200, &own)
		if len(own.Rows) != 1 {
			t.Fatalf("run %s alone: %d rows", row.RunID, len(own.Rows))
		}
		if d := diffFields(row, own.Rows[0]); len(d) > 0 {
			t.Errorf("run %s differs in its sweep from alone (sweep vs alone):\n  %s", row.RunID, strings.Join(d, "\n  "))
		}
		seen[row.RunID] = row
	}
	if len(sweep.Rows) != 4 || sweep.Baseline != "bare" {
		t.Fatalf("sweep rows %d, baseline %q: %s", len(sweep.Rows), sweep.Baseline, asJSON(sweep))
	}
	f := func(v *api.Float) float64 {
		if v == nil {
			return -1
		}
		return float64(*v)
	}
	// What each shape shows, so that a figure both reads lost is seen.
	if r := seen["done"]; r.Status != api.StatusFinished || !near(f(r.BestEvalAcc), 0.65) || !near(f(r.FinalLoss), 1.5) ||
		!near(f(r.GPUUtilPct), 90) || r.Sources["gpu_util_pct"] != api.SourceSteps || r.StepTimeS == nil || r.SamplesPerS == nil ||
		r.TFLOPS == nil || r.MFU == nil || r.GPUMemAllocPeakMB == nil || r.WastedGPUH == nil {
		t.Errorf("done: %s", asJSON(r))
	}
	if r := seen["eta"]; r.Status != api.StatusRunning || !near(f(r.GPUUtilPct), 70) || r.Sources["gpu_util_pct"] != api.SourceGPUSamples ||
		!near(f(r.GPUMemMeanMB), 20e3) || !near(f(r.FinalLoss), 2) || r.BestEvalAcc != nil {
		t.Errorf("eta: %s", asJSON(r))
	}
	if r := seen["clock"]; r.StepsPerS == nil || !near(f(r.StepsPerS), 0.5) || r.StepTimeS != nil {
		t.Errorf("clock: %s", asJSON(r))
	}
	if r := seen["bare"]; r.StepTimeS != nil || r.FinalLoss != nil || r.Parallelism != "pipeline" || f(r.WastedGPUH) != 0 {
		t.Errorf("bare: %s", asJSON(r))
	}
}
