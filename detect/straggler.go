package detect

import (
	"fmt"
	"maps"
	"slices"

	"github.com/deepseed/deepseed/api"
)

// straggler fires for each rank whose newest straggler score (see
// StragglerScores) is above StragglerPct % once at least MinScored steps
// were scored: the rank that makes the others wait at the
// synchronisation point. When lateness names nobody (collectives that
// block the host hide the waits from it), it fires for each rank whose
// own work is longer than the median rank's by more than StragglerPct %
// of the median step (OwnWorkOf), with the cause.
func straggler(cfg Config, in Rows) []Firing {
	out := lateStragglers(cfg, in)
	if len(out) > 0 {
		return out
	}
	return ownStragglers(cfg, in)
}

// lateStragglers is the lateness half of straggler.
func lateStragglers(cfg Config, in Rows) []Firing {
	if in.Scored < MinScored {
		return nil
	}
	var out []Firing
	for _, r := range slices.Sorted(maps.Keys(in.Scores)) {
		s := in.Scores[r]
		pct := 100 * s.Score
		if pct <= cfg.StragglerPct {
			continue
		}
		rank, st := r, s.Step
		out = append(out, Firing{Kind: api.AlertStraggler, Subject: rankSubject(r), Rank: &rank, Step: &st,
			Value: pct, Threshold: cfg.StragglerPct, At: s.Time,
			Text: fmt.Sprintf("straggler: rank %d arrives at the synchronisation point late by %.0f %% of the ranks' median busy time (EWMA; %.1f ms at step %d) and the other ranks wait for it",
				r, pct, s.Late, st)})
	}
	return out
}

// ownStragglers is the own-work half of straggler, over the newest
// Window steps of each rank.
func ownStragglers(cfg Config, in Rows) []Firing {
	o := OwnWorkOf(in.Steps, cfg.Window)
	var out []Firing
	for _, r := range o.Stragglers(cfg.StragglerPct) {
		x := o.Ranks[r]
		rank := r
		st := in.Steps[r][0].Step
		pct := 100 * x.ExcessMS / o.MedStepMS
		out = append(out, Firing{Kind: api.AlertStraggler, Subject: rankSubject(r), Rank: &rank, Step: &st,
			Value: pct, Threshold: cfg.StragglerPct, At: in.Steps[r][0].Time, Text: OwnText(r, x, o)})
	}
	return out
}

// OwnText is the sentence that names an own-work straggler, as the alert
// and the API say it.
func OwnText(r int, x OwnRank, o OwnWork) string {
	what := map[string]string{CauseData: "waiting for its input (data)", CauseHost: "on its host between the phases",
		CauseGPU: "in forward, backward and optimizer"}[x.Cause]
	wait := 0.0
	for q, y := range o.Ranks {
		if q != r {
			wait = max(wait, y.HiddenWaitMS)
		}
	}
	s := fmt.Sprintf("straggler: rank %d spends %.1f ms a step more than the median rank %s (%.0f %% of the %.1f ms step; median over the last %d steps)",
		r, x.ExcessMS, what, 100*x.ExcessMS/o.MedStepMS, o.MedStepMS, o.Steps)
	if wait >= OwnFloorMS {
		s += fmt.Sprintf(", and the other ranks wait for it: up to %.1f ms a step inside their forward and backward", wait)
	}
	return s
}

// MinScored is how many steps must be scored before a straggler fires.
const MinScored = 10
