package detect

import (
	"fmt"

	"github.com/deepseed/deepseed/api"
)

// overflowStorm fires when more than SkippedPct % of the lowest rank's
// last Window steps (at least 10) were skipped, or else when its newest
// loss scale is at or below MinLossScale.
func overflowStorm(cfg Config, in Rows) []Firing {
	lead := in.lead()
	n := min(len(lead), cfg.Window)
	if n < 10 {
		return nil
	}
	skipped := 0
	for _, s := range lead[:n] {
		if s.Skipped {
			skipped++
		}
	}
	pct := 100 * float64(skipped) / float64(n)
	step := lead[0].Step
	if pct > cfg.SkippedPct {
		return []Firing{{Kind: api.AlertOverflowStorm, Step: &step, Value: pct, Threshold: cfg.SkippedPct,
			Text: fmt.Sprintf("overflow storm: %d of the last %d steps skipped (%.0f %% > %g %%)", skipped, n, pct, cfg.SkippedPct),
			At:   lead[0].Time}}
	}
	if ls := lead[0].LossScale; ls != nil && *ls <= cfg.MinLossScale {
		return []Firing{{Kind: api.AlertOverflowStorm, Step: &step, Value: *ls, Threshold: cfg.MinLossScale,
			Text: fmt.Sprintf("loss scale at its floor (%g <= %g)", *ls, cfg.MinLossScale), At: lead[0].Time}}
	}
	return nil
}
