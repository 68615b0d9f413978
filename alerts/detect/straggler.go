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
// synchronisation point.
func straggler(cfg Config, in Rows) []Firing {
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

// MinScored is how many steps must be scored before a straggler fires.
const MinScored = 10
