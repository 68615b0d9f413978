package detect

import (
	"fmt"
	"math"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/stats"
)

// lossSpike scores the lowest rank's newest loss against the SpikeWindow
// losses before it: it fires when the robust z-score, 0.6745 · (x −
// median) / MAD, is above SpikeZ (with at least 20 steps read, 19 finite
// losses before the newest and a MAD above zero).
func lossSpike(cfg Config, in Rows) []Firing {
	rows := in.lead()
	if len(rows) < 20 || rows[0].Loss == nil || !finite(rows[0].Loss) {
		return nil
	}
	var prev []float64
	for _, s := range rows[1:min(len(rows), cfg.SpikeWindow+1)] {
		if s.Loss != nil && finite(s.Loss) {
			prev = append(prev, *s.Loss)
		}
	}
	if len(prev) < 19 {
		return nil
	}
	med := stats.Median(prev)
	dev := make([]float64, len(prev))
	for i, v := range prev {
		dev[i] = math.Abs(v - med)
	}
	mad := stats.Median(dev)
	if mad <= 0 {
		return nil
	}
	z := 0.6745 * (*rows[0].Loss - med) / mad
	if z <= cfg.SpikeZ {
		return nil
	}
	step := rows[0].Step
	return []Firing{{Kind: api.AlertLossSpike, Step: &step, Value: z, Threshold: cfg.SpikeZ, At: rows[0].Time,
		Text: fmt.Sprintf("loss spike at step %d: %g, robust z-score %.1f > %g", step, *rows[0].Loss, z, cfg.SpikeZ)}}
}
