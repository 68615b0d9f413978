package query

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// Run invariants (docs/metrics.md): numbers that cannot be true, said so
// in the run detail instead of drawn as if they were. The checks read the
// lowest rank's newest consistencySteps steps (a bounded index read,
// whatever the run's length and ranks) and the run's meta, config and
// parameters.

// consistencySteps is how many of the lowest rank's newest steps the
// checks read.
const consistencySteps = 2000

// Tolerances of the phases against the step: a phase may exceed the step
// by phaseTolMS (events and host clocks disagree by that much), their sum
// by phaseTolPct % of the step more.
const (
	phaseTolMS  = 1.0
	phaseTolPct = 5.0
)

// consistency checks the run against the invariants and returns what it
// breaks; s is its summary, whose mean MFU it clears when that mean is
// itself impossible.
func (h *Handler) consistency(ctx context.Context, r *store.RunRow, ranks []int, s *api.RunSummary) ([]api.ConsistencyCheck, error) {
	out := []api.ConsistencyCheck{}
	var m api.RunMeta
	_ = json.Unmarshal(r.Meta, &m)
	if c, ok := precisionCheck(s.Precision, r, s.Steps); ok {
		out = append(out, c)
	}
	if len(ranks) == 0 {
		return out, nil
	}
	f, err := h.store.Consistency(ctx, r.RunID, ranks[0], consistencySteps, phaseTolMS, phaseTolPct)
	if err != nil {
		return nil, err
	}
	read := fmt.Sprintf("of rank %d's newest %d steps", ranks[0], f.Rows)
	if n := f.MFUAbove1 + f.MFUNonPositive; n > 0 {
		seen := "MFU ≤ 0"
		if f.MaxMFU != nil && *f.MaxMFU > 1 {
			seen = fmt.Sprintf("MFU up to %.3g", *f.MaxMFU)
		}
		out = append(out, api.ConsistencyCheck{Check: api.CheckMFURange, Seen: seen, Steps: n,
			Text: fmt.Sprintf("%d %s have an MFU outside (0, 1]: no GPU runs above its peak, so the peak used (%s, precision %s) or the FLOPs or tokens counted are wrong; MFU is not shown as true", n, read, peakText(m), orUnknown(s.Precision))})
		if s.MeanMFU != nil && (*s.MeanMFU > 1 || *s.MeanMFU <= 0) {
			s.MeanMFU = nil
		}
	}
	if n := max(f.PhaseOverStep, f.SumOverStep); n > 0 {
		seen := ""
		if f.MaxSumRatio != nil {
			seen = fmt.Sprintf("forward + backward + optimizer up to %.2f × the step", *f.MaxSumRatio)
		}
		out = append(out, api.ConsistencyCheck{Check: api.CheckPhases, Seen: seen, Steps: n,
			Text: fmt.Sprintf("%d %s have a forward, backward or optimizer time longer than the step, or together longer than the step by more than %g %% + %g ms: the phases overlap or were timed on another clock, so the breakdown of those steps does not add up", n, read, phaseTolPct, phaseTolMS)})
	}
	if c, ok := microStepCheck(m, f, s, read); ok {
		out = append(out, c)
	}
	return out, nil
}

// microStepCheck: with gradient accumulation N > 1, a step is an
// optimizer step. Steps whose tokens are a 1/N of the others', or N times
// the steps the run said it would take, are micro-steps counted as steps.
func microStepCheck(m api.RunMeta, f store.ConsistencyFacts, s *api.RunSummary, read string) (api.ConsistencyCheck, bool) {
	if m.GradAccum == nil || *m.GradAccum < 2 {
		return api.ConsistencyCheck{}, false
	}
	n := float64(*m.GradAccum)
	if f.MinTokens != nil && f.MaxTokens != nil && *f.MinTokens > 0 && f.Partial > 0 {
		ratio := float64(*f.MaxTokens) / float64(*f.MinTokens)
		if ratio > 0.8*n && ratio < 1.25*n {
			return api.ConsistencyCheck{Check: api.CheckOptimizerStep, Seen: fmt.Sprintf("tokens %d and %d a step", *f.MinTokens, *f.MaxTokens),
				Steps: f.Partial, Text: fmt.Sprintf("%d %s carry %d tokens and the others %d, %.0f × as many, with gradient accumulation %d: micro-steps are counted as steps, so the step count, step times and MFU are per micro-batch", f.Partial, read, *f.MinTokens, *f.MaxTokens, ratio, *m.GradAccum)}, true
		}
	}
	if m.TotalSteps != nil && *m.TotalSteps > 0 && s.LastStep != nil {
		ratio := float64(*s.LastStep) / float64(*m.TotalSteps)
		if ratio > 0.8*n && ratio < 1.25*n {
			return api.ConsistencyCheck{Check: api.CheckOptimizerStep, Seen: fmt.Sprintf("%d steps for %d expected", *s.LastStep, *m.TotalSteps),
				Steps: *s.LastStep - *m.TotalSteps, Text: fmt.Sprintf("the run recorded %d steps where it said it would take %d optimizer steps, %.0f × as many, with gradient accumulation %d: micro-steps are counted as steps", *s.LastStep, *m.TotalSteps, ratio, *m.GradAccum)}, true
		}
	}
	return api.ConsistencyCheck{}, false
}

// precisionCheck compares the precision recorded with the ones the run's
// meta (autocast_dtype, dtype), config and parameters declare (DeepSpeed's
// fp16/bf16, Accelerate's mixed_precision, the Trainer's bf16/fp16).
func precisionCheck(recorded string, r *store.RunRow, steps int64) (api.ConsistencyCheck, bool) {
	rec := normPrecision(recorded)
	if rec == "" {
		return api.ConsistencyCheck{}, false
	}
	type src struct{ where, value string }
	var declared []src
	if p := precisionFromConfig(r.Config); p != "" {
		declared = append(declared, src{"the DeepSpeed config", p})
	}
	for _, x := range []struct {
		where string
		doc   json.RawMessage
		keys  []string
	}{{"the meta", r.Meta, []string{"autocast_dtype", "dtype"}}, {"the config", r.Config, []string{"mixed_precision"}},
		{"the parameters", r.Params, []string{"mixed_precision"}}} {
		var m map[string]json.RawMessage
		if json.Unmarshal(x.doc, &m) != nil {
			continue
		}
		for _, k := range x.keys {
			var v string
			if json.Unmarshal(m[k], &v) == nil && normPrecision(v) != "" {
				declared = append(declared, src{x.where + "'s " + k, v})
			}
		}
		if x.where == "the parameters" {
			for _, k := range []string{"bf16", "fp16"} {
				var on bool
				if json.Unmarshal(m[k], &on) == nil && on {
					declared = append(declared, src{"the parameters' " + k, k})
				}
			}
		}
	}
	for _, d := range declared {
		if p := normPrecision(d.value); p != rec {
			return api.ConsistencyCheck{Check: api.CheckPrecision, Seen: fmt.Sprintf("recorded %s, %s says %s", recorded, d.where, d.value), Steps: steps,
				Text: fmt.Sprintf("the run is recorded as %s but %s says %s: the peak TFLOP/s its MFU divides by is that of %s, so MFU is off by the ratio of the two peaks", recorded, d.where, d.value, recorded)}, true
		}
	}
	return api.ConsistencyCheck{}, false
}

// normPrecision maps the names precisions go by to fp32, fp16 or bf16
// ("" for none of them).
func normPrecision(v string) string {
	v = strings.TrimPrefix(strings.ToLower(strings.TrimSpace(v)), "torch.")
	switch v {
	case "bf16", "bfloat16", "bf16-mixed", "bf16-true":
		return "bf16"
	case "fp16", "float16", "half", "16", "16-mixed", "16-true":
		return "fp16"
	case "fp32", "float32", "float", "32", "32-true", "no", "tf32":
		return "fp32"
	}
	return ""
}

func peakText(m api.RunMeta) string {
	if m.PeakTFLOPS == nil || math.IsNaN(float64(*m.PeakTFLOPS)) {
		return "no peak recorded"
	}
	return fmt.Sprintf("%.4g TFLOP/s", float64(*m.PeakTFLOPS))
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
