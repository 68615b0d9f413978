package detect

import (
	"fmt"
	"math"

	"github.com/deepseed/deepseed/api"
)

// dataStall fires for each rank whose data_ms is above DataSharePct % of
// its step_ms, both summed over its last Window steps (at least 10) that
// have both.
func dataStall(cfg Config, in Rows) []Firing {
	var out []Firing
	for _, r := range in.ranks() {
		rows := in.Steps[r][:min(len(in.Steps[r]), cfg.Window)]
		var data, step float64
		for _, s := range rows {
			if s.StepMS != nil && !math.IsNaN(*s.StepMS) && s.DataMS != nil && !math.IsNaN(*s.DataMS) {
				data += *s.DataMS
				step += *s.StepMS
			}
		}
		if len(rows) < 10 || step <= 0 {
			continue
		}
		if pct := 100 * data / step; pct > cfg.DataSharePct {
			rank, st := r, rows[0].Step
			out = append(out, Firing{Kind: api.AlertDataStall, Subject: rankSubject(r), Rank: &rank, Step: &st,
				Value: pct, Threshold: cfg.DataSharePct, At: rows[0].Time,
				Text: fmt.Sprintf("data stall on rank %d: %.0f %% of step time getting batches (> %g %%)", r, pct, cfg.DataSharePct)})
		}
	}
	return out
}
