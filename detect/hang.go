package detect

import (
	"encoding/json"
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
	hangs := in.Hangs
	if len(hangs) == 0 {
		return nil
	}
	newestStep := map[int]int64{}
	for r, rows := range in.Steps {
		if len(rows) > 0 {
			newestStep[r] = rows[0].Step
		}
	}
	var newest time.Time
	for _, h := range hangs {
		if h.Time.After(newest) {
			newest = h.Time
		}
	}
	s := SummarizeHang(hangs, newestStep)
	rank, step := s.First[0], s.Step
	return []Firing{{Kind: api.AlertHang, Subject: "", Rank: &rank, Step: &step, Value: float64(len(hangs)),
		At: newest, Text: s.Text + "; every thread's stack is in the run's hang events"}}
}

// HangSummary is who stopped first in a hang and the sentence saying so.
type HangSummary struct {
	First []int  // the ranks that stopped first, ascending
	Step  int64  // the step they are on
	Text  string // "rank 1 stopped first: rank 0 on step 25, waiting in …; rank 1 on step 25, outside …"
}

// SummarizeHang says which ranks stopped first, given each rank's newest
// hang report (at least one) and the newest step of ranks that may have
// sent none (a rank without a report is on the step after its newest).
// The hang alert and the run's hang annotations both say it this way.
func SummarizeHang(hangs []HangReport, newestStep map[int]int64) HangSummary {
	type where struct {
		step    int64
		waiting bool // inside a collective the device has not completed
		report  *HangReport
	}
	at := map[int]where{}
	for r, s := range newestStep {
		at[r] = where{step: s + 1}
	}
	for i := range hangs {
		h := &hangs[i]
		at[h.Rank] = where{step: h.Step, waiting: h.InCollective, report: h}
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
	return HangSummary{First: first, Step: low, Text: fmt.Sprintf("%s stopped first: %s", who, strings.Join(parts, "; "))}
}

// ParseHangReport reads what the hang summary needs of a hang event of
// rank at t on step: the hook's JSON text (hook/deepseed/hang.py), whose
// step, when present, is the one the rank is on.
func ParseHangReport(rank int, t time.Time, step int64, text string) HangReport {
	h := HangReport{Rank: rank, Time: t, Step: step}
	var r struct {
		Reason         string `json:"reason"`
		Step           *int64 `json:"step"`
		LastCollective *struct {
			Name      string `json:"name"`
			Seq       int64  `json:"seq"`
			Completed *bool  `json:"completed"`
		} `json:"last_collective"`
	}
	if json.Unmarshal([]byte(text), &r) != nil {
		return h
	}
	h.Reason = r.Reason
	if r.Step != nil {
		h.Step = *r.Step
	}
	if c := r.LastCollective; c != nil {
		h.HasCollectives, h.Collective, h.Seq = true, c.Name, c.Seq
		h.InCollective = c.Completed != nil && !*c.Completed
	}
	return h
}
