package detect

import (
	"fmt"
	"slices"

	"github.com/deepseed/deepseed/api"
)

// nonFinite fires one alert per run while one of the newest
// NonFiniteSteps steps of any rank has a non-finite loss or grad norm,
// naming where that streak began — the oldest non-finite step read that
// is not followed by NonFiniteSteps finite ones — so a batch of many
// steps at once (an import, a collector catching up) names the step the
// loss first went bad.
func nonFinite(cfg Config, in Rows) []Firing {
	var nf *StepRow
	bad := func(s StepRow) bool { return !finite(s.Loss) || !finite(s.GradNorm) }
	for _, r := range in.ranks() {
		rows := in.Steps[r]
		if !slices.ContainsFunc(rows[:min(len(rows), cfg.NonFiniteSteps)], bad) {
			continue
		}
		first, gap := -1, 0
		for i := range rows {
			if bad(rows[i]) {
				first, gap = i, 0
			} else if gap++; gap >= cfg.NonFiniteSteps {
				break
			}
		}
		if nf == nil || rows[first].Step < nf.Step {
			nf = &rows[first]
		}
	}
	if nf == nil {
		return nil
	}
	what, v := "loss", nf.Loss
	if finite(nf.Loss) {
		what, v = "grad norm", nf.GradNorm
	}
	rank, step := nf.Rank, nf.Step
	return []Firing{{Kind: api.AlertNonFinite, Rank: &rank, Step: &step, Value: *v,
		Text: fmt.Sprintf("non-finite %s (%v) at step %d on rank %d", what, *v, step, rank), At: nf.Time}}
}
