package query

import (
	"context"
	"fmt"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/detect"
	"github.com/deepseed/deepseed/store"
)

// hangEpisode is how long before a hang report the other ranks' reports
// still belong to the same hang: the hooks of a job report within their
// threshold of one another.
const hangEpisode = 10 * time.Minute

// maxHangRuns bounds the runs whose steps an annotations answer reads to
// summarise their hangs.
const maxHangRuns = 20

// summarizeHangs sets the summary of each hang annotation (anns[i] is
// evs[i] for i < len(evs)): the sentence of the hang alert (who stopped
// first, where, the last collective), over every rank's newest report of
// the same hang up to that one and the ranks that sent none.
func (h *Handler) summarizeHangs(ctx context.Context, anns []api.Annotation, evs []store.EventRow) error {
	byRun := map[string][]int{}
	for i, e := range evs {
		if e.Type == api.EventHang && e.Rank >= 0 && (len(byRun) < maxHangRuns || byRun[e.RunID] != nil) {
			byRun[e.RunID] = append(byRun[e.RunID], i)
		}
	}
	for runID, idx := range byRun {
		ranks, err := h.store.RunRanks(ctx, runID)
		if err != nil {
			return fmt.Errorf("hang summary of %s: %w", runID, err)
		}
		var steps []detect.StepRow
		if len(ranks) > 0 {
			if steps, err = h.store.RecentSteps(ctx, runID, ranks, 1); err != nil {
				return fmt.Errorf("hang summary of %s: %w", runID, err)
			}
		}
		reports := make([]detect.HangReport, len(idx))
		for j, i := range idx {
			e := evs[i]
			reports[j] = detect.ParseHangReport(e.Rank, e.Time, e.Step, e.Text)
		}
		for j, i := range idx {
			anns[i].Summary = hangSentence(reports, reports[j].Time, steps)
		}
	}
	return nil
}

// hangSentence summarises the hang reported at t: each rank's newest
// report in the episode before it, and the newest step of the ranks
// without one that stopped stepping before t.
func hangSentence(reports []detect.HangReport, t time.Time, steps []detect.StepRow) string {
	newest := map[int]detect.HangReport{}
	for _, r := range reports {
		if r.Time.After(t) || r.Time.Before(t.Add(-hangEpisode)) {
			continue
		}
		if old, ok := newest[r.Rank]; !ok || r.Time.After(old.Time) {
			newest[r.Rank] = r
		}
	}
	in := make([]detect.HangReport, 0, len(newest))
	for _, r := range newest {
		in = append(in, r)
	}
	silent := map[int]int64{}
	for _, s := range steps {
		if _, ok := newest[s.Rank]; !ok && s.Time.Before(t) {
			silent[s.Rank] = s.Step
		}
	}
	return detect.SummarizeHang(in, silent).Text + "; every thread's stack is in the Hang reports table"
}
