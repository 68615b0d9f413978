package detect

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/deepseed/deepseed/api"
)

// Hang forensics (hook/deepseed/hang.py): when a rank's steps stop for
// longer than the hook's threshold, or it gets SIGTERM, its hook sends an
// event of type "hang" whose text says where it is: the step it is on,
// the last collective it entered and whether the device completed it,
// every thread's stack. The hang alert holds while the run has such
// events newer than its newest step and names the rank(s) that stopped
// first: the lowest step any rank is on (a rank that sent no event is on
// the step after its newest); among ranks on that step, those not left
// waiting inside a collective, which are the ones the others wait for;
// when all of them wait, those that entered the fewest collectives (the
// hook numbers the collectives of a run's steps, the same on every rank of
// a job whose ranks issue the same collectives in the same order, as DDP,
// FSDP and ZeRO do): the others wait for them to catch up.

// HangReport is one rank's newest hang event.
type HangReport struct {
	Rank           int
	Time           time.Time
	Step           int64
	InCollective   bool   // its last collective was entered and not completed
	Collective     string // that collective's name
	Reason         string
	HasCollectives bool
	Seq            int64 // the number of that collective among the run's
}

// hang fires one hang alert for the run when hang events came after its
// newest step.
func hang(_ Config, in Rows) []Firing {
	hangs, byRank := in.Hangs, in.Steps
	if len(hangs) == 0 {
		return nil
	}
	type where struct {
		step    int64
		waiting bool // inside a collective the device has not completed
		report  *HangReport
	}
	at := map[int]where{}
	for r, rows := range byRank {
		if len(rows) > 0 {
			at[r] = where{step: rows[0].Step + 1}
		}
	}
	var newest time.Time
	for i := range hangs {
		h := &hangs[i]
		at[h.Rank] = where{step: h.Step, waiting: h.InCollective, report: h}
		if h.Time.After(newest) {
			newest = h.Time
		}
	}
	ranks := make([]int, 0, len(at))
	for r := range at {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	low := at[ranks[0]].step
	for _, r := range ranks {
		low = min(low, at[r].step)
	}
	var first, waiting []int
	for _, r := range ranks {
		if w := at[r]; w.step == low {
			if w.waiting {
				waiting = append(waiting, r)
			} else {
				first = append(first, r)
			}
		}
	}
	if len(first) == 0 {
		fewest := at[waiting[0]].report.Seq
		for _, r := range waiting {
			fewest = min(fewest, at[r].report.Seq)
		}
		for _, r := range waiting {
			if at[r].report.Seq == fewest {
				first = append(first, r)
			}
		}
	}
	var parts []string
	for _, r := range ranks {
		w := at[r]
		s := fmt.Sprintf("rank %d on step %d", r, w.step)
		switch {
		case w.report == nil:
			s += " (no hang report: its newest step is " + fmt.Sprint(w.step-1) + ")"
		case w.report.InCollective:
			s += fmt.Sprintf(", waiting in %s (its collective %d)", w.report.Collective, w.report.Seq)
		case w.report.HasCollectives:
			s += ", outside any collective (its last, " + w.report.Collective + ", completed)"
		}
		parts = append(parts, s)
	}
	names := make([]string, len(first))
	for i, r := range first {
		names[i] = fmt.Sprint(r)
	}
	who := "rank " + names[0]
	if len(names) > 1 {
		who = "ranks " + strings.Join(names, ", ")
	}
	rank, step := first[0], low
	return []Firing{{Kind: api.AlertHang, Subject: "", Rank: &rank, Step: &step, Value: float64(len(hangs)),
		At: newest, Text: fmt.Sprintf("%s stopped first: %s; every thread's stack is in the run's hang events",
			who, strings.Join(parts, "; "))}}
}
