package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// RankSync is one rank's synchronisation figures over the steps from a
// first step on that every rank reported (docs/ranks.md).
type RankSync struct {
	Rank  int
	Steps int64 // steps with a lateness
	// Medians over those steps, milliseconds: lateness (arrival at the
	// synchronisation point after the first rank's), busy (step time less
	// the collective's wait) and the wait itself.
	LatenessMS, BusyMS, SyncWaitMS *float64
	MeanSyncWaitMS                 *float64
	InputWaitMS                    *float64 // mean host time blocked behind the device between steps
	LastPct                        *float64 // share of the steps it arrived last, percent
	ClockOffsetMS                  *float64 // estimated offset of its host clock; nil without waits
	Score                          *float64 // newest straggler score (rank_score_heads), a fraction of a step
	ScoreStep                      *int64
}

// RankSyncs computes each rank's lateness, busy and wait over the steps
// with step >= from, and returns them with what the lateness came from:
// "arrivals" (sync_ns, clock offsets estimated from the collective's
// common release), "waits" (max wait − own wait) or "" when the steps
// carry neither.
func (s *Store) RankSyncs(ctx context.Context, runID string, from int64) ([]RankSync, string, error) {
	rows, err := s.pool.Query(ctx, `
		WITH `+completeSteps("c", "$2", "")+`, `+clockOffsets("c", perRank)+`, `+lateness("c", perRank)+`, m AS (
			SELECT *, max(late) OVER (PARTITION BY step) AS latest FROM l
		)
		SELECT m.rank, count(late), percentile_cont(0.5) WITHIN GROUP (ORDER BY late),
		       percentile_cont(0.5) WITHIN GROUP (ORDER BY busy), percentile_cont(0.5) WITHIN GROUP (ORDER BY w),
		       avg(w), avg(input_wait_ms),
		       100 * avg(CASE WHEN late = latest AND latest > 0 THEN 1 ELSE 0 END) FILTER (WHERE late IS NOT NULL),
		       min(off.off), max(src)
		FROM m LEFT JOIN off USING (rank) GROUP BY m.rank ORDER BY m.rank`, runID, from)
	if err != nil {
		return nil, "", fmt.Errorf("store: rank synchronisation of %s: %w", runID, err)
	}
	var src string
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RankSync, error) {
		var a RankSync
		var src1 *string
		err := r.Scan(&a.Rank, &a.Steps, &a.LatenessMS, &a.BusyMS, &a.SyncWaitMS, &a.MeanSyncWaitMS, &a.InputWaitMS,
			&a.LastPct, &a.ClockOffsetMS, &src1)
		if src1 != nil && (src == "" || *src1 == "waits") {
			src = *src1 // the weaker source wins when steps mix them
		}
		return a, err
	})
	if err != nil {
		return nil, "", fmt.Errorf("store: rank synchronisation of %s: %w", runID, err)
	}
	heads, err := s.scoreHeads(ctx, runID)
	if err != nil {
		return nil, "", err
	}
	for i, a := range out {
		if h, ok := heads[a.Rank]; ok {
			out[i].Score, out[i].ScoreStep = &h.Score, &h.Step
		}
	}
	return out, src, nil
}
