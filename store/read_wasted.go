package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Wasted holds the GPU-hours a run wasted, by cause (docs/ranks.md):
//
//	idle      Σ over the run's GPU samples below IdleUtilPct % utilisation
//	          of the time to the GPU's next sample (at most a minute),
//	          leaving out samples inside a stall
//	straggler Σ over steps every rank reported of Σ_r (wait_r − min wait):
//	          each GPU's wait in the collective beyond the wait of the rank
//	          that arrived last, which is the all-reduce itself
//	stalled   Σ over gaps between consecutive steps longer than the stall
//	          limit, max(StallMin, StallSteps × median step), of the gap
//	          less one median step, × the ranks; a running run's silence
//	          since its newest step counts when it passes the limit
//	skipped   Σ over skipped (overflow) steps of the step time × the ranks
//
// Each rank is one GPU. Total is the sum of the four.
type Wasted struct {
	IdleGPUH, StragglerGPUH, StalledGPUH, SkippedGPUH, TotalGPUH float64
}

// WasteRules are the thresholds Wasted uses; the detectors' defaults.
type WasteRules struct {
	IdleUtilPct float64
	StallMin    time.Duration
	StallSteps  float64
}

// DefaultWasteRules matches the alert detectors' defaults.
var DefaultWasteRules = WasteRules{IdleUtilPct: 10, StallMin: 5 * time.Minute, StallSteps: 10}

const msPerHour = 3.6e6

// WastedGPUHours computes a run's wasted GPU-hours; running says whether
// the run is still running (its silence up to now may be a stall).
func (s *Store) WastedGPUHours(ctx context.Context, runID string, running bool, now time.Time, rules WasteRules) (Wasted, error) {
	var w Wasted
	var ranks int
	var lowest *int
	var medStep *float64
	err := s.Pool.QueryRow(ctx, `WITH r AS (SELECT min(rank) AS lo, count(DISTINCT rank) AS n FROM steps WHERE run_id = $1)
		SELECT r.n, r.lo, (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY step_ms) FROM steps
			WHERE run_id = $1 AND rank = r.lo AND step_ms > 0) FROM r`, runID).Scan(&ranks, &lowest, &medStep)
	if err != nil {
		return w, fmt.Errorf("store: wasted GPU-hours of %s: %w", runID, err)
	}
	var stallLo, stallHi []time.Time
	if lowest != nil {
		med := 0.0
		if medStep != nil {
			med = *medStep
		}
		limit := max(rules.StallMin, time.Duration(rules.StallSteps*med*float64(time.Millisecond)))
		rows, err := s.Pool.Query(ctx, `SELECT t, next FROM (
				SELECT time AS t, lead(time) OVER (ORDER BY step, time) AS next FROM steps WHERE run_id = $1 AND rank = $2
			) g WHERE next - t > make_interval(secs => $3)`, runID, *lowest, limit.Seconds())
		if err != nil {
			return w, fmt.Errorf("store: stalls of %s: %w", runID, err)
		}
		for rows.Next() {
			var lo, hi time.Time
			if err := rows.Scan(&lo, &hi); err != nil {
				rows.Close()
				return w, fmt.Errorf("store: stalls of %s: %w", runID, err)
			}
			stallLo, stallHi = append(stallLo, lo), append(stallHi, hi)
			w.StalledGPUH += float64(ranks) * (float64(hi.Sub(lo).Milliseconds()) - med) / msPerHour
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return w, fmt.Errorf("store: stalls of %s: %w", runID, err)
		}
		if running {
			var last time.Time
			err := s.Pool.QueryRow(ctx, `SELECT time FROM steps WHERE run_id = $1 AND rank = $2 ORDER BY step DESC, time DESC LIMIT 1`,
				runID, *lowest).Scan(&last)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return w, fmt.Errorf("store: newest step of %s: %w", runID, err)
			}
			if err == nil && now.Sub(last) > limit {
				stallLo, stallHi = append(stallLo, last), append(stallHi, now)
				w.StalledGPUH += float64(ranks) * (float64(now.Sub(last).Milliseconds()) - med) / msPerHour
			}
		}
		var skipped *float64
		if err := s.Pool.QueryRow(ctx, `SELECT sum(step_ms) FROM steps WHERE run_id = $1 AND rank = $2 AND skipped AND step_ms > 0`,
			runID, *lowest).Scan(&skipped); err != nil {
			return w, fmt.Errorf("store: skipped steps of %s: %w", runID, err)
		}
		if skipped != nil {
			w.SkippedGPUH = float64(ranks) * *skipped / msPerHour
		}
		var strag *float64
		if err := s.Pool.QueryRow(ctx, `SELECT sum(w - lo) FROM (
				SELECT sync_wait_ms AS w, min(sync_wait_ms) OVER st AS lo, count(sync_wait_ms) OVER st AS n
				FROM (SELECT DISTINCT ON (rank, step) rank, step, sync_wait_ms FROM steps WHERE run_id = $1
					ORDER BY rank, step, time DESC) d
				WINDOW st AS (PARTITION BY step)
			) x WHERE n = $2 AND n >= 2`, runID, ranks).Scan(&strag); err != nil {
			return w, fmt.Errorf("store: straggler waits of %s: %w", runID, err)
		}
		if strag != nil {
			w.StragglerGPUH = *strag / msPerHour
		}
	}
	var idleS *float64
	if err := s.Pool.QueryRow(ctx, `SELECT sum(least(extract(epoch FROM next - time), 60)) FROM (
			SELECT time, util_pct, lead(time) OVER (PARTITION BY host, gpu ORDER BY time) AS next
			FROM gpu_samples WHERE run_id = $1 AND run_id <> '' AND util_pct IS NOT NULL
		) g WHERE util_pct < $2 AND next IS NOT NULL
		  AND NOT EXISTS (SELECT 1 FROM unnest($3::timestamptz[], $4::timestamptz[]) AS st(lo, hi) WHERE g.time >= st.lo AND g.time < st.hi)`,
		runID, rules.IdleUtilPct, stallLo, stallHi).Scan(&idleS); err != nil {
		return w, fmt.Errorf("store: idle GPU time of %s: %w", runID, err)
	}
	if idleS != nil {
		w.IdleGPUH = *idleS / 3600
	}
	w.TotalGPUH = w.IdleGPUH + w.StragglerGPUH + w.StalledGPUH + w.SkippedGPUH
	return w, nil
}
