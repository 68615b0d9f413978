package detect

import (
	"fmt"
	"math"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/stats"
)

// stalled fires when a running run's newest step, over all its ranks, is
// older by the server's clock than the stall limit.
func stalled(cfg Config, in Rows) []Firing {
	if !in.Running || len(in.Steps) == 0 {
		return nil
	}
	newest, limit := stallLimit(cfg, in)
	quiet := in.Now.Sub(newest)
	if quiet <= limit {
		return nil
	}
	return []Firing{{Kind: api.AlertStalled, Value: quiet.Seconds(), Threshold: limit.Seconds(), At: newest,
		Text: fmt.Sprintf("no step for %s (limit %s)", quiet.Round(time.Second), limit.Round(time.Second))}}
}

// stallLimit returns the time of the run's newest step over its ranks and
// how long the run, or a rank behind it, may go without a step:
// max(StallMin, StallSteps × the median over ranks of each rank's median
// step time over its last Window steps).
func stallLimit(cfg Config, in Rows) (newest time.Time, limit time.Duration) {
	var meds []float64
	for _, r := range in.ranks() {
		rows := in.Steps[r]
		if t := rows[0].Time; t.After(newest) {
			newest = t
		}
		var sts []float64
		for _, s := range rows[:min(len(rows), cfg.Window)] {
			if s.StepMS != nil && !math.IsNaN(*s.StepMS) {
				sts = append(sts, *s.StepMS)
			}
		}
		if len(sts) > 0 {
			meds = append(meds, stats.Median(sts))
		}
	}
	limit = time.Duration(cfg.StallMin)
	if len(meds) > 0 {
		limit = max(limit, time.Duration(cfg.StallSteps*stats.Median(meds)*float64(time.Millisecond)))
	}
	return newest, limit
}
