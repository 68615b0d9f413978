package detect

import (
	"fmt"
	"time"

	"github.com/deepseed/deepseed/api"
)

// rankStopped fires, while the run runs, for each rank whose newest step
// is older than the run's newest step by more than the stall limit (see
// stallLimit): step times against its peers, not the server's clock.
func rankStopped(cfg Config, in Rows) []Firing {
	if !in.Running || len(in.Steps) == 0 {
		return nil
	}
	newest, limit := stallLimit(cfg, in)
	var out []Firing
	for _, r := range in.ranks() {
		last := in.Steps[r][0]
		if behind := newest.Sub(last.Time); behind > limit {
			rank, st := r, last.Step
			out = append(out, Firing{Kind: api.AlertRankStopped, Subject: rankSubject(r), Rank: &rank, Step: &st,
				Value: behind.Seconds(), Threshold: limit.Seconds(), At: last.Time,
				Text: fmt.Sprintf("rank %d stopped at step %d, %s before the other ranks' newest step", r, st, behind.Round(time.Second))})
		}
	}
	return out
}
