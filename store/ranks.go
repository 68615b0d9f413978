package store

import (
	"context"
	"errors"
	"fmt"
	"time"

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
	Score                          *float64 // newest straggler score (rank_scores), a fraction of a step
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
	scores, err := s.pool.Query(ctx, `SELECT DISTINCT ON (rank) rank, step, score FROM rank_scores
		WHERE run_id = $1 ORDER BY rank, step DESC`, runID)
	if err != nil {
		return nil, "", fmt.Errorf("store: straggler scores of %s: %w", runID, err)
	}
	defer scores.Close()
	byRank := map[int]int{}
	for i, a := range out {
		byRank[a.Rank] = i
	}
	for scores.Next() {
		var rank int
		var step int64
		var score float64
		if err := scores.Scan(&rank, &step, &score); err != nil {
			return nil, "", fmt.Errorf("store: straggler scores of %s: %w", runID, err)
		}
		if i, ok := byRank[rank]; ok {
			out[i].Score, out[i].ScoreStep = &score, &step
		}
	}
	if err := scores.Err(); err != nil {
		return nil, "", fmt.Errorf("store: straggler scores of %s: %w", runID, err)
	}
	return out, src, nil
}

// ScorePoint is one stored straggler score.
type ScorePoint struct {
	Rank       int
	Step       int64
	Time       time.Time
	LatenessMS *float64
	Score      float64
}

// RankScores returns the stored straggler scores of a run between from
// and to, by rank and step, at most limit rows.
func (s *Store) RankScores(ctx context.Context, runID string, from, to time.Time, limit int) ([]ScorePoint, error) {
	if limit <= 0 {
		return nil, errors.New("store: rank scores: limit must be positive")
	}
	rows, err := s.pool.Query(ctx, `SELECT rank, step, time, lateness_ms, score FROM rank_scores
		WHERE run_id = $1 AND time >= $2 AND time <= $3 ORDER BY rank, step LIMIT $4`, runID, from, to, limit)
	if err != nil {
		return nil, fmt.Errorf("store: rank scores of %s: %w", runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ScorePoint, error) {
		var p ScorePoint
		err := r.Scan(&p.Rank, &p.Step, &p.Time, &p.LatenessMS, &p.Score)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: rank scores of %s: %w", runID, err)
	}
	return out, nil
}
