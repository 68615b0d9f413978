package detect

import (
	"strings"
	"testing"
	"time"
)

// A run whose last blocks are 12 % slower for seven minutes, with thermal
// throttling in the recent samples, drifts with the cause named; the
// same run without the slowdown, or with it for only two minutes, does
// not.
func TestDriftNamesThrottling(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	blocks := func(slow, n int) []StepBlock {
		var out []StepBlock
		at := t0
		for i := range n {
			ms := 1000.0
			if i >= n-slow {
				ms = 1120
			}
			d := time.Duration(100 * ms * float64(time.Millisecond))
			out = append(out, StepBlock{FirstStep: int64(i * 100), FirstTime: at, LastTime: at.Add(d), StepMS: ms})
			at = at.Add(d)
		}
		return out
	}
	cfg := Defaults()
	hot := GPUWindow{Samples: 100, ThrottlePct: 40, Reasons: []string{"thermal"}, Throttled: []string{"n1/gpu 0"}}
	d := DriftOf(cfg, DriftInput{Blocks: blocks(4, 16), Ref: GPUWindow{Samples: 100}, Recent: hot})
	if d == nil || d.Cause != "thermal_throttling" || d.DropPct < 10 || !strings.Contains(d.Text, "n1/gpu 0") {
		t.Fatalf("drift %+v", d)
	}
	if d := DriftOf(cfg, DriftInput{Blocks: blocks(0, 16)}); d != nil {
		t.Errorf("steady run drifts: %+v", d)
	}
	if d := DriftOf(cfg, DriftInput{Blocks: blocks(1, 16)}); d != nil {
		t.Errorf("two slow minutes drift: %+v", d)
	}
	in := Rows{Running: true, Drift: &DriftInput{Blocks: blocks(4, 16), Recent: hot}}
	if f := drift(cfg, in); len(f) != 1 || f[0].Subject != "thermal_throttling" {
		t.Errorf("firings %+v", f)
	}
}
