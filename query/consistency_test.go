package query_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/api"
)

// An Accelerate run as the issue measured it: gradient accumulation 4,
// every micro-step recorded as a step (tokens 2,048 on three of four and
// 8,192 on the fourth), MFU up to 1.2155 against the fp32 peak, recorded
// as fp32 while Accelerate's mixed precision is bf16, and a forward
// timed longer than its step. GET /runs/{id} says each, with how many
// steps, and does not give the impossible mean MFU as true; a clean run
// of the same shape has an empty list.
func TestRunConsistencySaysWhatCannotBeTrue(t *testing.T) {
	e := newEnv(t)
	ga := 4
	meta := &api.RunMeta{Precision: "fp32", GradAccum: &ga, PeakTFLOPS: api.F(66.9), GPU: "NVIDIA H200"}
	bad := runRec("accel", meta)
	bad.Run.Config = json.RawMessage(`{"mixed_precision": "bf16", "gradient_accumulation_steps": 4}`)
	recs := []api.Record{bad}
	clean := runRec("clean", &api.RunMeta{Precision: "bf16", GradAccum: &ga, PeakTFLOPS: api.F(989)})
	clean.Run.Config = json.RawMessage(`{"mixed_precision": "bf16"}`)
	recs = append(recs, clean)
	for step := int64(1); step <= 160; step++ {
		recs = append(recs, stepRec("accel", 0, step, func(s *api.Step) {
			tok := int64(2048)
			mfu := 0.3
			if step%4 == 0 {
				tok, mfu = 8192, 1.2155
			}
			fwd := 10.0
			if step == 7 {
				fwd = 40 // longer than its 30 ms step
			}
			s.Tokens, s.MFU, s.StepMS, s.ForwardMS, s.BackwardMS, s.OptimizerMS = &tok, api.F(mfu), api.F(30), api.F(fwd), api.F(15), api.F(0)
		}))
		if step <= 40 {
			recs = append(recs, stepRec("clean", 0, step, func(s *api.Step) {
				tok := int64(8192)
				s.Tokens, s.MFU, s.StepMS, s.ForwardMS, s.BackwardMS, s.OptimizerMS = &tok, api.F(0.03), api.F(120), api.F(30), api.F(60), api.F(20)
			}))
		}
	}
	e.write(recs...)

	var d api.RunDetail
	e.get("/runs/accel", 200, &d)
	got := map[string]api.ConsistencyCheck{}
	for _, c := range d.Consistency {
		got[c.Check] = c
	}
	for _, w := range []struct {
		check string
		steps int64
		text  string
	}{
		{api.CheckMFURange, 40, "MFU outside (0, 1]"},
		{api.CheckPhases, 1, "longer than the step"},
		{api.CheckOptimizerStep, 120, "micro-steps are counted as steps"},
		{api.CheckPrecision, 160, "recorded as fp32 but the config's mixed_precision says bf16"},
	} {
		c, ok := got[w.check]
		if !ok {
			t.Errorf("no %s check in %+v", w.check, d.Consistency)
			continue
		}
		if c.Steps != w.steps || !strings.Contains(c.Text, w.text) || c.Seen == "" {
			t.Errorf("%s: steps %d seen %q text %q; want %d steps and %q", w.check, c.Steps, c.Seen, c.Text, w.steps, w.text)
		}
	}
	if len(d.Consistency) != 4 {
		t.Errorf("consistency %+v; want the four checks", d.Consistency)
	}
	if d.MeanMFU != nil && *d.MeanMFU > 1 {
		t.Errorf("mean MFU %v shown as true", *d.MeanMFU)
	}

	var c api.RunDetail
	e.get("/runs/clean", 200, &c)
	if c.Consistency == nil || len(c.Consistency) != 0 {
		t.Errorf("clean run consistency %+v; want an empty list", c.Consistency)
	}
}
