package detect

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

func f(v float64) *float64 { return &v }

// steps builds n steps of one rank, newest first, one a second up to end.
func steps(rank, n int, end time.Time, stepMS, dataMS float64, loss func(step int) float64) []StepRow {
	out := make([]StepRow, n)
	for i := range n {
		step := n - i
		out[i] = StepRow{Rank: rank, Step: int64(step), Time: end.Add(-time.Duration(i) * time.Second),
			Loss: f(loss(step)), StepMS: f(stepMS), DataMS: f(dataMS)}
	}
	return out
}

func kinds(fs []Firing) map[string][]Firing {
	m := map[string][]Firing{}
	for _, x := range fs {
		m[x.Kind] = append(m[x.Kind], x)
	}
	return m
}

func TestDetectSpikeStragglerDataStallRankStopped(t *testing.T) {
	cfg := Defaults()
	now := time.Now()
	wavy := func(s int) float64 { return 2 + 0.01*float64(s%7) }
	byRank := map[int][]StepRow{
		0: steps(0, 60, now, 100, 5, wavy),
		1: steps(1, 60, now, 100, 5, wavy),
		2: steps(2, 60, now, 140, 60, wavy),                     // starves on data; slower steps alone name no straggler
		3: steps(3, 60, now.Add(-10*time.Minute), 100, 5, wavy), // stopped ten minutes ago
	}
	byRank[0][0].Loss = f(9) // spike on the newest step
	got := kinds(Run(cfg, Rows{Steps: byRank, Running: true, Now: now}))
	if s := got[api.AlertLossSpike]; len(s) != 1 || *s[0].Step != 60 {
		t.Errorf("loss spike: %+v; want one at step 60", s)
	}
	// Slower steps alone name no straggler; rank 2's own data time, 55 ms
	// longer than the median rank's, does (the own-work signal).
	if s := got[api.AlertStraggler]; len(s) != 1 || *s[0].Rank != 2 || !strings.Contains(s[0].Text, "55.0 ms a step more than the median rank waiting for its input (data)") {
		t.Errorf("straggler: %+v; want rank 2, named by its own data time", s)
	}
	if s := got[api.AlertDataStall]; len(s) != 1 || *s[0].Rank != 2 {
		t.Errorf("data stall: %+v; want rank 2", s)
	}
	if s := got[api.AlertRankStopped]; len(s) != 1 || *s[0].Rank != 3 {
		t.Errorf("rank stopped: %+v; want rank 3", s)
	}
	if s := got[api.AlertStalled]; len(s) != 0 {
		t.Errorf("stalled fired on a run that stepped just now: %+v", s)
	}
	// A finished run is never stalled and has no stopped rank.
	got = kinds(Run(cfg, Rows{Steps: byRank, Running: false, Now: now.Add(time.Hour)}))
	if len(got[api.AlertStalled])+len(got[api.AlertRankStopped]) != 0 {
		t.Errorf("absence detectors fired on a finished run: %+v", got)
	}
	// Healthy ranks fire nothing.
	calm := map[int][]StepRow{0: steps(0, 60, now, 100, 5, wavy), 1: steps(1, 60, now, 101, 5, wavy)}
	if fs := Run(cfg, Rows{Steps: calm, Running: true, Now: now}); len(fs) != 0 {
		t.Errorf("healthy run fired %+v", fs)
	}
}

func TestConfigFromRunMeta(t *testing.T) {
	def := Defaults()
	c := def.WithMeta([]byte(`{"model":"x","alerts":{"idle_util_pct":5,"idle_for":"10m","stall_min":600,"window":0}}`))
	if c.IdleUtilPct != 5 || time.Duration(c.IdleFor) != 10*time.Minute || time.Duration(c.StallMin) != 10*time.Minute {
		t.Errorf("overrides not applied: %+v", c)
	}
	if c.Window != def.Window || c.SkippedPct != def.SkippedPct {
		t.Errorf("an out-of-range or absent field changed: %+v", c)
	}
	if c := def.WithMeta([]byte(`{"alerts":{"idle_for":"soon"}}`)); c != def {
		t.Errorf("a malformed override changed the defaults: %+v", c)
	}
}

// A batch of many steps read at once names the step where the loss first
// went non-finite, not the oldest of the newest few; an older bad step
// followed by a long healthy stretch is not named.
func TestDetectNonFiniteNamesWhereTheStreakBegan(t *testing.T) {
	cfg := Defaults()
	now := time.Now()
	nan := func(from int) func(int) float64 {
		return func(s int) float64 {
			if s >= from {
				return nanValue()
			}
			return 0.7
		}
	}
	got := kinds(Run(cfg, Rows{Steps: map[int][]StepRow{0: steps(0, 20, now, 100, 5, nan(3)), 1: steps(1, 20, now, 100, 5, nan(4))}, Running: false, Now: now}))
	if s := got[api.AlertNonFinite]; len(s) != 1 || *s[0].Step != 3 || *s[0].Rank != 0 {
		t.Fatalf("non-finite: %+v; want one, at step 3 on rank 0", s)
	}
	// Step 5 was bad, then 30 healthy steps, then bad again from step 36.
	rows := steps(0, 40, now, 100, 5, nan(36))
	rows[40-5].Loss = f(nanValue())
	got = kinds(Run(cfg, Rows{Steps: map[int][]StepRow{0: rows}, Running: false, Now: now}))
	if s := got[api.AlertNonFinite]; len(s) != 1 || *s[0].Step != 36 {
		t.Fatalf("non-finite: %+v; want one, at step 36", s)
	}
	// A run that recovered fires nothing.
	rows = steps(0, 40, now, 100, 5, func(int) float64 { return 0.7 })
	rows[40-5].Loss = f(nanValue())
	if s := kinds(Run(cfg, Rows{Steps: map[int][]StepRow{0: rows}, Running: false, Now: now}))[api.AlertNonFinite]; len(s) != 0 {
		t.Fatalf("non-finite on a run healthy for 35 steps: %+v", s)
	}
}

func nanValue() float64 { return math.NaN() }

func TestDetectHangTies(t *testing.T) {
	now := time.Now()
	flat := func(int) float64 { return 1 }
	byRank := map[int][]StepRow{0: steps(0, 19, now, 100, 5, flat), 1: steps(1, 19, now, 100, 5, flat),
		2: steps(2, 19, now, 100, 5, flat)}
	// Ranks 0 and 1 wait inside the step-20 all-reduce; rank 2 sent nothing
	// (its process died after step 19): rank 2 is the one they wait for.
	hangs := []HangReport{{Rank: 0, Time: now, Step: 20, InCollective: true, Collective: "all_reduce", HasCollectives: true},
		{Rank: 1, Time: now, Step: 20, InCollective: true, Collective: "all_reduce", HasCollectives: true}}
	fs := hang(Defaults(), Rows{Hangs: hangs, Steps: byRank})
	if len(fs) != 1 || *fs[0].Rank != 2 || !strings.Contains(fs[0].Text, "rank 2 stopped first") {
		t.Fatalf("firings %+v; want rank 2 named", fs)
	}
	// Every rank waiting on the same step: the one that entered the fewest
	// collectives is the one the others wait for; a tie names them all.
	hangs[1].Seq, hangs[0].Seq = 362, 381
	hangs = append(hangs, HangReport{Rank: 2, Time: now, Step: 20, InCollective: true, Collective: "all_reduce", HasCollectives: true, Seq: 381})
	fs = hang(Defaults(), Rows{Hangs: hangs, Steps: byRank})
	if len(fs) != 1 || *fs[0].Rank != 1 || !strings.Contains(fs[0].Text, "rank 1 stopped first") {
		t.Fatalf("firings %+v; want rank 1 named", fs)
	}
	hangs[1].Seq = 381
	fs = hang(Defaults(), Rows{Hangs: hangs, Steps: byRank})
	if len(fs) != 1 || *fs[0].Rank != 0 || !strings.Contains(fs[0].Text, "ranks 0, 1, 2 stopped first") {
		t.Fatalf("firings %+v; want ranks 0, 1, 2 named", fs)
	}
	if fs := hang(Defaults(), Rows{Hangs: nil, Steps: byRank}); len(fs) != 0 {
		t.Fatalf("no hang events fired %+v", fs)
	}
}
