package detect

import (
	"fmt"
	"time"

	"github.com/deepseed/deepseed/api"
)

// idleGPU fires, while the run runs, for each of its GPUs below
// IdleUtilPct % utilisation for IdleFor of sample time: from its last
// busy sample, or its first, to its newest.
func idleGPU(cfg Config, in Rows) []Firing {
	if !in.Running {
		return nil
	}
	var out []Firing
	for _, g := range in.GPUs {
		idle := g.Last.Sub(g.IdleSince)
		if g.LastUtil >= cfg.IdleUtilPct || idle < time.Duration(cfg.IdleFor) {
			continue
		}
		out = append(out, Firing{Kind: api.AlertIdleGPU, Subject: fmt.Sprintf("%s/gpu %d", g.Host, g.GPU), Rank: g.Rank,
			Value: g.LastUtil, Threshold: cfg.IdleUtilPct, At: g.IdleSince,
			Text: fmt.Sprintf("GPU %d of %s below %g %% utilisation for %s", g.GPU, g.Host, cfg.IdleUtilPct, idle.Round(time.Second))})
	}
	return out
}
