package detect

import (
	"maps"
	"math"
	"slices"
	"time"

	"github.com/deepseed/deepseed/internal/stats"
)

// Lateness under synchronous training (docs/ranks.md).
//
// Every rank of a data-parallel step leaves the gradient all-reduce at
// the same moment, whichever arrived last; so step times are equal and
// cannot name a straggler. What differs is when each rank arrived at the
// collective and how long it then waited:
//
//	lateness(r) = arrival(r) − min over ranks of arrival
//	busy(r)     = step_ms(r) − sync_wait_ms(r)
//
// Arrivals are host clock readings (sync_ns). Ranks of one host share a
// clock; across hosts the clocks differ by an unknown offset, estimated
// from the data itself: the collective releases every rank together, so
// release(r) = arrival(r) + sync_wait(r) is the same instant on every
// rank, and the median over the window of release(r) − min release is
// rank r's clock offset. Its error is how far apart the ranks really
// leave the collective (microseconds within a host, the last all-reduce
// chunk's transfer across hosts) plus the hook's event-to-clock anchor
// error. Without waits the offsets are taken as zero (one clock); without
// arrivals but with waits, lateness(r) = max wait − wait(r), which needs
// no clock at all.

// SyncStep is one step that every rank reported, with each rank's
// lateness, busy and wait milliseconds (NaN where unknown).
type SyncStep struct {
	Step    int64
	Time    time.Time
	Late    map[int]float64
	Busy    map[int]float64
	Wait    map[int]float64
	MedBusy float64 // median over ranks of Busy, the score's scale
}

// SyncSteps lines the ranks' newest rows up by step and returns the steps
// every rank reported and that have lateness, oldest first.
func SyncSteps(byRank map[int][]StepRow, window int) []SyncStep {
	ranks, steps, rows := completeSteps(byRank, window)
	if len(ranks) < 2 {
		return nil
	}

	// Per-rank clock offsets from the releases of the steps with both.
	rel := map[int][]float64{}
	for _, st := range steps {
		m := rows[st]
		lo, ok := math.Inf(1), true
		for _, r := range ranks {
			s := m[r]
			if s.SyncNS == nil || !num(s.SyncWaitMS) {
				ok = false
				break
			}
			lo = math.Min(lo, release(s))
		}
		if !ok {
			continue
		}
		for _, r := range ranks {
			rel[r] = append(rel[r], release(m[r])-lo)
		}
	}
	off := map[int]float64{}
	for r, v := range rel {
		off[r] = stats.Median(v)
	}

	out := make([]SyncStep, 0, len(steps))
	for _, st := range steps {
		m := rows[st]
		x := SyncStep{Step: st, Late: map[int]float64{}, Busy: map[int]float64{}, Wait: map[int]float64{}}
		arrivals, waits := true, true
		maxWait := math.Inf(-1)
		var busy []float64
		for _, r := range ranks {
			s := m[r]
			if s.Time.After(x.Time) {
				x.Time = s.Time
			}
			arrivals = arrivals && s.SyncNS != nil
			waits = waits && num(s.SyncWaitMS)
			w := math.NaN()
			if num(s.SyncWaitMS) {
				w = *s.SyncWaitMS
				maxWait = math.Max(maxWait, w)
			}
			x.Wait[r] = w
			b := math.NaN()
			if num(s.StepMS) {
				b = *s.StepMS
				if !math.IsNaN(w) {
					b = math.Max(0, b-w)
				}
				busy = append(busy, b)
			}
			x.Busy[r] = b
		}
		switch {
		case arrivals:
			first := math.Inf(1)
			for _, r := range ranks {
				first = math.Min(first, arrivalMS(m[r])-off[r])
			}
			for _, r := range ranks {
				x.Late[r] = arrivalMS(m[r]) - off[r] - first
			}
		case waits:
			for _, r := range ranks {
				x.Late[r] = maxWait - x.Wait[r]
			}
		default:
			continue
		}
		x.MedBusy = math.NaN()
		if len(busy) > 0 {
			x.MedBusy = stats.Median(busy)
		}
		out = append(out, x)
	}
	return out
}

// completeSteps lines the ranks' newest window rows up by step (each
// rank's newest first, as ByRank groups them): the ranks, lowest first,
// the steps every rank reported, oldest first, and each step's row of
// each rank (the newest row of a step wins).
func completeSteps(byRank map[int][]StepRow, window int) ([]int, []int64, map[int64]map[int]StepRow) {
	ranks := slices.Sorted(maps.Keys(byRank))
	rows := map[int64]map[int]StepRow{}
	for _, r := range ranks {
		for _, s := range byRank[r][:min(len(byRank[r]), window)] {
			m := rows[s.Step]
			if m == nil {
				m = map[int]StepRow{}
				rows[s.Step] = m
			}
			if _, dup := m[r]; !dup { // newest first: the newest row of a step wins
				m[r] = s
			}
		}
	}
	var steps []int64
	for st, m := range rows {
		if len(m) == len(ranks) {
			steps = append(steps, st)
		}
	}
	slices.Sort(steps)
	return ranks, steps, rows
}

// arrivalMS is a row's arrival in milliseconds since the Unix epoch;
// float64 keeps a quarter of a microsecond there.
func arrivalMS(s StepRow) float64 { return float64(*s.SyncNS) / 1e6 }

func release(s StepRow) float64 { return arrivalMS(s) + *s.SyncWaitMS }

func num(p *float64) bool { return p != nil && !math.IsNaN(*p) && !math.IsInf(*p, 0) }

// RankScore is one rank's straggler score after a step.
type RankScore struct {
	Rank             int
	Step             int64
	Time             time.Time
	Late, Busy, Wait float64
	Score            float64
}

// StragglerScores folds the steps, oldest first, into each rank's score:
// an EWMA (weight alpha on the newest step) of its lateness over the
// step's median busy time. prev seeds a rank's EWMA with a stored score
// of the step before the first one folded (nil: start at the first
// step's value). It returns every step's scores, oldest first.
func StragglerScores(steps []SyncStep, alpha float64, prev map[int]float64) []RankScore {
	ewma := map[int]float64{}
	for r, v := range prev {
		ewma[r] = v
	}
	var out []RankScore
	for _, x := range steps {
		if !(x.MedBusy > 0) {
			continue
		}
		ranks := make([]int, 0, len(x.Late))
		for r := range x.Late {
			ranks = append(ranks, r)
		}
		slices.Sort(ranks)
		for _, r := range ranks {
			v := x.Late[r] / x.MedBusy
			if e, ok := ewma[r]; ok {
				v = alpha*v + (1-alpha)*e
			}
			ewma[r] = v
			out = append(out, RankScore{Rank: r, Step: x.Step, Time: x.Time, Late: x.Late[r], Busy: x.Busy[r], Wait: x.Wait[r], Score: v})
		}
	}
	return out
}
