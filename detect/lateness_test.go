package detect

import (
	"math"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

func i64(v int64) *int64 { return &v }

// syncRows builds n steps of each of ranks, newest first, every step
// 100 ms long on every rank; late(rank, step) is how many milliseconds
// after the first arrival the rank arrives, and every rank leaves the
// collective together 2 ms after the last arrival. skew shifts a rank's
// host clock.
func syncRows(ranks, n int, late func(rank, step int) float64, skew func(rank int) float64) map[int][]StepRow {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	out := map[int][]StepRow{}
	for step := n; step >= 1; step-- {
		base := float64(step) * 100 // ms since t0, first arrival
		last := 0.0
		for r := range ranks {
			last = math.Max(last, late(r, step))
		}
		for r := range ranks {
			arr := base + late(r, step)
			wait := base + last + 2 - arr
			out[r] = append(out[r], StepRow{Rank: r, Step: int64(step), Time: t0.Add(time.Duration(base) * time.Millisecond),
				StepMS: f(100), SyncNS: i64(t0.UnixNano() + int64((arr+skew(r))*1e6)), SyncWaitMS: f(wait)})
		}
	}
	return out
}

func TestLatenessNamesTheLateRankWhateverTheClocks(t *testing.T) {
	cfg := Defaults()
	late := func(r, step int) float64 {
		if r == 3 {
			return 25
		}
		return float64(r%2) * 0.5 // a little jitter among the healthy ranks
	}
	for name, skew := range map[string]func(int) float64{
		"one clock":          func(int) float64 { return 0 },
		"clocks 40 ms apart": func(r int) float64 { return float64(r/4) * 40 }, // ranks 4-7 on a host 40 ms ahead
	} {
		steps := SyncSteps(syncRows(8, 60, late, skew), cfg.Window)
		if len(steps) != cfg.Window {
			t.Fatalf("%s: %d complete steps, want %d", name, len(steps), cfg.Window)
		}
		for _, x := range steps {
			if d := x.Late[3] - 25; math.Abs(d) > 1e-3 {
				t.Fatalf("%s: step %d: rank 3 lateness %v, want 25", name, x.Step, x.Late[3])
			}
			if x.Late[0] != 0 || math.Abs(x.Late[1]-0.5) > 1e-3 {
				t.Fatalf("%s: step %d: lateness %v", name, x.Step, x.Late)
			}
		}
		sc := StragglerScores(steps, cfg.StragglerAlpha, nil)
		newest := map[int]RankScore{}
		for _, s := range sc {
			newest[s.Rank] = s
		}
		fs := straggler(cfg, Rows{Scores: newest, Scored: len(steps)})
		if len(fs) != 1 || *fs[0].Rank != 3 || fs[0].Kind != api.AlertStraggler {
			t.Fatalf("%s: stragglers %+v; want rank 3 alone", name, fs)
		}
		// The busy time scales the score: the healthy ranks are busy
		// 100 − 27.5 or 100 − 27 ms, the median over 8 ranks 73 ms.
		if want := 25.0 / 73; math.Abs(newest[3].Score-want) > 0.01 {
			t.Fatalf("%s: rank 3 score %v, want about %v", name, newest[3].Score, want)
		}
	}

	// Without arrivals the waits alone give the same lateness.
	rows := syncRows(8, 60, late, func(int) float64 { return 0 })
	for r := range rows {
		for i := range rows[r] {
			rows[r][i].SyncNS = nil
		}
	}
	steps := SyncSteps(rows, cfg.Window)
	if len(steps) == 0 || math.Abs(steps[0].Late[3]-25) > 1e-9 {
		t.Fatalf("from waits: %+v", steps)
	}

	// Once rank 3 stops being late its score decays below the margin.
	stop := func(r, step int) float64 {
		if r == 3 && step <= 40 {
			return 25
		}
		return 0
	}
	steps = SyncSteps(syncRows(8, 60, stop, func(int) float64 { return 0 }), cfg.Window)
	newest := map[int]RankScore{}
	for _, s := range StragglerScores(steps, cfg.StragglerAlpha, nil) {
		newest[s.Rank] = s
	}
	if fs := straggler(cfg, Rows{Scores: newest, Scored: len(steps)}); len(fs) != 0 {
		t.Fatalf("20 punctual steps later still fires: %+v (score %v)", fs, newest[3].Score)
	}
	// Equal step times and no lateness: nothing.
	steps = SyncSteps(syncRows(8, 60, func(int, int) float64 { return 0 }, func(int) float64 { return 0 }), cfg.Window)
	newest = map[int]RankScore{}
	for _, s := range StragglerScores(steps, cfg.StragglerAlpha, nil) {
		newest[s.Rank] = s
	}
	if fs := straggler(cfg, Rows{Scores: newest, Scored: len(steps)}); len(fs) != 0 {
		t.Fatalf("punctual ranks fire %+v", fs)
	}
}
