package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
// the run is still running (its silence up to now may be a stall). The
// work does not grow with ranks × steps: the ranks come from an index
// skip, the straggler waits from the run's spread (refresh its rollups
// first), stalls and skipped steps from the lowest rank's rollups with
// raw rows only in the blocks that hold one, idle time from the idle
// samples alone.
func (s *Store) WastedGPUHours(ctx context.Context, runID string, running bool, now time.Time, rules WasteRules) (Wasted, error) {
	ranks, err := s.RunRanks(ctx, runID)
	if err != nil {
		return Wasted{}, err
	}
	return s.WastedGPUHoursOfRanks(ctx, runID, ranks, running, now, rules)
}

// WastedGPUHoursOfRanks is [Store.WastedGPUHours] of a run whose ranks
// (ascending, as [Store.RunRanks] gives them) the caller has read.
func (s *Store) WastedGPUHoursOfRanks(ctx context.Context, runID string, ranks []int, running bool, now time.Time, rules WasteRules) (Wasted, error) {
	if len(ranks) == 0 {
		return s.WastedGPUHoursOf(ctx, runID, 0, 0, running, now, rules)
	}
	return s.WastedGPUHoursOf(ctx, runID, len(ranks), ranks[0], running, now, rules)
}

// WastedGPUHoursOf is [Store.WastedGPUHours] of a run whose ranks (how
// many, and the lowest) the caller knows, from a run summary.
func (s *Store) WastedGPUHoursOf(ctx context.Context, runID string, nRanks, lowest int, running bool, now time.Time, rules WasteRules) (Wasted, error) {
	var w Wasted
	var stallLo, stallHi []time.Time
	if nRanks > 0 {
		med, err := s.medianStepMS(ctx, runID, lowest)
		if err != nil {
			return w, err
		}
		limit := max(rules.StallMin, time.Duration(rules.StallSteps*med*float64(time.Millisecond)))
		gaps, err := s.stepGaps(ctx, runID, lowest, limit)
		if err != nil {
			return w, err
		}
		for _, g := range gaps {
			stallLo, stallHi = append(stallLo, g[0]), append(stallHi, g[1])
			w.StalledGPUH += float64(nRanks) * (float64(g[1].Sub(g[0]).Milliseconds()) - med) / msPerHour
		}
		if running {
			var last time.Time
			err := s.pool.QueryRow(ctx, `SELECT time FROM steps WHERE run_id = $1 AND rank = $2
				AND step >= coalesce((SELECT max::bigint FROM metric_rollup_rows
					WHERE run_id = $1 AND rank = $2 AND width = $3 AND bucket = 0 AND metric = 'step'), 0) - 100
				ORDER BY step DESC, time DESC LIMIT 1`, runID, lowest, TotalWidth).Scan(&last)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return w, fmt.Errorf("store: newest step of %s: %w", runID, err)
			}
			if err == nil && now.Sub(last) > limit {
				stallLo, stallHi = append(stallLo, last), append(stallHi, now)
				w.StalledGPUH += float64(nRanks) * (float64(now.Sub(last).Milliseconds()) - med) / msPerHour
			}
		}
		// The raw rows of the buckets that hold a skipped step, bucket by
		// bucket (OFFSET 0 keeps the planner from turning this around into
		// a scan of every step of the rank, which its guess of one skipped
		// step makes look cheap: 0.46 s at 20,000 steps against 3 ms).
		var skipped *float64
		if err := s.pool.QueryRow(ctx, `SELECT sum(s.step_ms) FROM metric_rollups m CROSS JOIN LATERAL (
				SELECT step_ms FROM steps s WHERE s.run_id = m.run_id AND s.rank = m.rank
				  AND s.step >= m.bucket * 100 AND s.step < (m.bucket + 1) * 100 AND s.skipped AND s.step_ms > 0
				OFFSET 0
			) s
			WHERE m.run_id = $1 AND m.rank = $2 AND m.width = 100 AND m.metric = 'skipped' AND m.sum > 0`, runID, lowest).Scan(&skipped); err != nil {
			return w, fmt.Errorf("store: skipped steps of %s: %w", runID, err)
		}
		if skipped != nil {
			w.SkippedGPUH = float64(nRanks) * *skipped / msPerHour
		}
		var strag *float64
		if err := s.pool.QueryRow(ctx, `SELECT sum FROM metric_spread WHERE run_id = $1 AND metric = 'straggler_wait_ms' AND width = $2 AND bucket = 0`,
			runID, TotalWidth).Scan(&strag); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return w, fmt.Errorf("store: straggler waits of %s: %w", runID, err)
		}
		if strag != nil {
			w.StragglerGPUH = *strag / msPerHour
		}
	}
	// Each idle sample counts until its GPU's next sample of the run (at
	// most a minute). Only the minutes whose lowest utilisation is under
	// the threshold (gpu_minutes) are read; the threshold is a literal so
	// that the partial index of idle samples serves them on plain
	// PostgreSQL.
	idle := strconv.FormatFloat(rules.IdleUtilPct, 'g', -1, 64)
	var idleS *float64
	if err := s.pool.QueryRow(ctx, `SELECT sum(least(extract(epoch FROM n.next - g.time), 60)) FROM (
			SELECT s.host, s.gpu, s.time FROM gpu_minutes m CROSS JOIN LATERAL (
				SELECT s.host, s.gpu, s.time FROM gpu_samples s
				WHERE s.run_id = $1 AND s.run_id <> '' AND s.time >= m.minute AND s.time < m.minute + interval '1 minute'
				  AND s.host = m.host AND s.util_pct < `+idle+`
			) s
			WHERE m.run_id = $1 AND m.util_min < `+idle+`
		) g CROSS JOIN LATERAL (
			SELECT min(s.time) AS next FROM gpu_samples s WHERE s.host = g.host AND s.gpu = g.gpu
			  AND s.time > g.time AND s.time <= g.time + interval '1 hour' AND s.run_id = $1 AND s.util_pct IS NOT NULL
		) n
		WHERE n.next IS NOT NULL
		  AND NOT EXISTS (SELECT 1 FROM unnest($2::timestamptz[], $3::timestamptz[]) AS st(lo, hi) WHERE g.time >= st.lo AND g.time < st.hi)`,
		runID, stallLo, stallHi).Scan(&idleS); err != nil {
		return w, fmt.Errorf("store: idle GPU time of %s: %w", runID, err)
	}
	if idleS != nil {
		w.IdleGPUH = *idleS / 3600
	}
	w.TotalGPUH = w.IdleGPUH + w.StragglerGPUH + w.StalledGPUH + w.SkippedGPUH
	return w, nil
}

// medianStepMS is the median positive step time of one rank, 0 when none.
func (s *Store) medianStepMS(ctx context.Context, runID string, rank int) (float64, error) {
	var med *float64
	// The rank's row count from its whole-run rollup: counting its
	// steps would read them (decompress them, on compressed chunks).
	err := s.pool.QueryRow(ctx, `
		WITH n AS (SELECT coalesce((SELECT count FROM metric_rollup_rows
			WHERE run_id = $1 AND rank = $2 AND width = $4 AND bucket = 0 AND metric = 'step'), 0) AS n)
		SELECT CASE WHEN (SELECT n FROM n) <= $3 THEN
			(SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY step_ms) FROM steps WHERE run_id = $1 AND rank = $2 AND step_ms > 0)
		ELSE
			(SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY sum / count) FROM metric_rollups
			 WHERE run_id = $1 AND rank = $2 AND width = 100 AND metric = 'step_ms' AND count > 0 AND sum > 0)
		END`, runID, rank, RawRankSteps, TotalWidth).Scan(&med)
	if err != nil {
		return 0, fmt.Errorf("store: median step time of %s: %w", runID, err)
	}
	if med == nil {
		return 0, nil
	}
	return *med, nil
}

// stepGaps returns the gaps longer than limit between consecutive steps of
// one rank, as [from, to] pairs. Only blocks whose steps span more than
// limit, and the joins between consecutive blocks, can hold one: rows are
// read in those blocks only.
func (s *Store) stepGaps(ctx context.Context, runID string, rank int, limit time.Duration) ([][2]time.Time, error) {
	rows, err := s.pool.Query(ctx, `
		WITH b AS (
			SELECT bucket, first_time, last_time, lag(last_time) OVER (ORDER BY bucket) AS prev_last
			FROM metric_rollups WHERE run_id = $1 AND rank = $2 AND width = 100 AND metric = 'step'
		), wide AS (
			SELECT bucket FROM b WHERE last_time - first_time > make_interval(secs => $3)
			   OR first_time - prev_last > make_interval(secs => $3)
		)
		SELECT t, next FROM (
			SELECT s.time AS t, lead(s.time) OVER (PARTITION BY wide.bucket ORDER BY s.step, s.time) AS next
			FROM wide CROSS JOIN LATERAL (
				SELECT step, time FROM steps s WHERE s.run_id = $1 AND s.rank = $2
				  AND s.step >= (wide.bucket - 1) * 100 AND s.step < (wide.bucket + 1) * 100
			) s
		) g WHERE next - t > make_interval(secs => $3) GROUP BY t, next ORDER BY t`, runID, rank, limit.Seconds())
	if err != nil {
		return nil, fmt.Errorf("store: stalls of %s: %w", runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]time.Time, error) {
		var g [2]time.Time
		err := r.Scan(&g[0], &g[1])
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: stalls of %s: %w", runID, err)
	}
	return out, nil
}
