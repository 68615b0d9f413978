package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reads for steady-state analysis: per-step timing rows, the step time
// over a run that steady-state detection looks at, and per-rank aggregates
// over the steps from the steady state on.

// TimingRow is one step's timings, for steady-state detection and
// breakdowns.
type TimingRow struct {
	Rank                          int
	Step                          int64
	Time                          time.Time
	StepMS, ForwardMS, BackwardMS *float64
	OptimizerMS, CommMS, DataMS   *float64
	GPUUtil, GPUMemGB, CPUUtil    *float64
	ThroughputSPS                 *float64
	Loss                          *float64
	Samples                       *int64
	GPUMemPeakGB                  *float64
}

// Timings returns timing rows of one rank (rank < 0: every rank) with
// step in [from, to], ordered by rank and step.
func (s *Store) Timings(ctx context.Context, runID string, rank int, from, to int64) ([]TimingRow, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT rank, step, time, step_ms, forward_ms, backward_ms, optimizer_ms, comm_ms, data_ms,
		       gpu_util_pct, gpu_mem_used_gb, cpu_util_pct, throughput_sps, loss, samples, gpu_mem_peak_gb
		FROM steps WHERE run_id = $1 AND ($2 < 0 OR rank = $2) AND step >= $3 AND step <= $4
		ORDER BY rank, step`, runID, rank, from, to)
	if err != nil {
		return nil, fmt.Errorf("store: timings of %s: %w", runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TimingRow, error) {
		var t TimingRow
		err := r.Scan(&t.Rank, &t.Step, &t.Time, &t.StepMS, &t.ForwardMS, &t.BackwardMS, &t.OptimizerMS, &t.CommMS,
			&t.DataMS, &t.GPUUtil, &t.GPUMemGB, &t.CPUUtil, &t.ThroughputSPS, &t.Loss, &t.Samples, &t.GPUMemPeakGB)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: timings of %s: %w", runID, err)
	}
	return out, nil
}

// StepMSTimeline returns (step, mean step_ms) of one rank: the raw rows
// when there are at most maxRaw of them, else the width-100 rollups (each
// point the mean of its bucket), which is enough to find where the step
// time settles.
func (s *Store) StepMSTimeline(ctx context.Context, runID string, rank int, maxRaw int) ([]RawPoint, error) {
	m, err := s.StepMSTimelines(ctx, []RankFrom{{RunID: runID, Rank: rank}}, maxRaw)
	return m[runID], err
}

// StepMSTimelines is [Store.StepMSTimeline] of one rank of each of runs
// (From unused), keyed by run, in at most three statements.
func (s *Store) StepMSTimelines(ctx context.Context, runs []RankFrom, maxRaw int) (map[string][]RawPoint, error) {
	ids, ranks, _ := rankFromArrays(runs)
	what := runsWhat(ids)
	// Each rank's rows from its whole-run rollup when it has one (counting
	// the steps would read them); else counted, at most maxRaw+1.
	rows, err := s.pool.Query(ctx, `SELECT x.run_id, coalesce(
		(SELECT count FROM metric_rollup_rows WHERE run_id = x.run_id AND rank = x.rank AND width = $4 AND bucket = 0 AND metric = 'step'),
		(SELECT count(*) FROM (SELECT 1 FROM steps WHERE run_id = x.run_id AND rank = x.rank LIMIT $3) c))
		FROM unnest($1::text[], $2::int[]) AS x(run_id, rank)`, ids, ranks, maxRaw+1, TotalWidth)
	if err != nil {
		return nil, fmt.Errorf("store: count steps of %s: %w", what, err)
	}
	large := map[string]bool{}
	for rows.Next() {
		var id string
		var n int64
		if err := rows.Scan(&id, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("store: count steps of %s: %w", what, err)
		}
		large[id] = n > int64(maxRaw)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: count steps of %s: %w", what, err)
	}
	var raw, rolled []RankFrom
	for _, r := range runs {
		if large[r.RunID] {
			rolled = append(rolled, r)
		} else {
			raw = append(raw, r)
		}
	}
	out := make(map[string][]RawPoint, len(runs))
	type point struct {
		RawPoint
		bucket int64
	}
	by := map[string][]point{}
	read := func(q string, rr []RankFrom, arg any, withBucket bool) error {
		if len(rr) == 0 {
			return nil
		}
		ids, ranks, _ := rankFromArrays(rr)
		rows, err := s.pool.Query(ctx, q, ids, ranks, arg)
		if err != nil {
			return fmt.Errorf("store: step times of %s: %w", what, err)
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			var p point
			var sum float64
			var n int64
			var err error
			if withBucket {
				if err = rows.Scan(&id, &p.bucket, &p.Step, &p.Time, &sum, &n); err == nil && n > 0 {
					p.Value = sum / float64(n)
					by[id] = append(by[id], p)
				}
			} else if err = rows.Scan(&id, &p.Step, &p.Time, &p.Value); err == nil {
				by[id] = append(by[id], p)
			}
			if err != nil {
				return fmt.Errorf("store: step times of %s: %w", what, err)
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("store: step times of %s: %w", what, err)
		}
		return nil
	}
	// The raw rows, as [Store.SeriesRaw] reads step_ms.
	expr, err := metricExpr("step_ms")
	if err != nil {
		return nil, err
	}
	// OFFSET 0 keeps each run's read a scan of its own rows of the index,
	// never a join with every run's steps.
	if err := read(`SELECT x.run_id, s.step, s.time, s.v FROM unnest($1::text[], $2::int[]) AS x(run_id, rank)
		CROSS JOIN LATERAL (SELECT step, time, `+expr+` AS v FROM steps
			WHERE run_id = x.run_id AND rank = x.rank AND step >= 0 AND step <= $3 OFFSET 0) s
		WHERE s.v IS NOT NULL`, raw, MaxStepValue, false); err != nil {
		return nil, err
	}
	// The width-100 rollups, as [Store.MetricRollups] reads them.
	if err := read(`SELECT x.run_id, m.bucket, m.first_step, m.first_time, coalesce(m.sum, 'NaN'), m.count
		FROM unnest($1::text[], $2::int[]) AS x(run_id, rank)
		CROSS JOIN LATERAL (SELECT bucket, first_step, first_time, sum, count FROM metric_rollups
			WHERE run_id = x.run_id AND rank = x.rank AND metric = 'step_ms' AND width = $3 AND bucket >= 0 OFFSET 0) m`,
		rolled, RollupWidths[0], true); err != nil {
		return nil, err
	}
	for id, ps := range by {
		slices.SortFunc(ps, func(a, b point) int {
			return cmp.Or(cmp.Compare(a.bucket, b.bucket), cmp.Compare(a.Step, b.Step), a.Time.Compare(b.Time))
		})
		pts := make([]RawPoint, len(ps))
		for i, p := range ps {
			pts[i] = p.RawPoint
		}
		out[id] = pts
	}
	return out, nil
}

// SteadyRank holds steady-state aggregates of one rank over the steps from
// a first step on.
type SteadyRank struct {
	Rank                                       int
	Rows                                       int64
	FirstStep, LastStep                        int64
	FirstTime, LastTime                        time.Time
	StepMS, ForwardMS, BackwardMS, OptimizerMS *float64
	// CommMS is the mean time a collective was in flight, CommExposedMS
	// the mean time the compute stream waited on communication.
	CommMS, CommExposedMS, DataMS            *float64
	MedianStepMS, P95StepMS                  *float64
	GPUUtil, CPUUtil, GPUMemGB, PeakGPUMemGB *float64
	// MaxGPUMemUsedGB is the highest gpu_mem_used_gb (a sender's NVML
	// reading); AllocPeakGB and ReservedPeakGB the highest allocator
	// peaks (gpu_mem_peak_gb, gpu_mem_reserved_gb) the hook measured.
	MaxGPUMemUsedGB, AllocPeakGB, ReservedPeakGB *float64
	ThroughputSPS                                *float64
	TFLOPS, MFU                                  *float64
	WaitMS                                       *float64
}

// SteadyByRank aggregates every rank's steps with step >= from (and
// rank = onlyRank when onlyRank >= 0). WaitMS is the mean, over steps, of
// how much less busy (forward+backward+optimizer, or step minus
// communication) the rank was than the busiest rank of that step: the time
// it spends waiting on the others.
func (s *Store) SteadyByRank(ctx context.Context, runID string, from int64, onlyRank int) ([]SteadyRank, error) {
	rows, err := s.pool.Query(ctx, `
		WITH s AS (
			SELECT rank, step, time, step_ms, forward_ms, backward_ms, optimizer_ms, comm_ms, comm_exposed_ms, data_ms,
			       gpu_util_pct, cpu_util_pct, gpu_mem_used_gb, gpu_mem_peak_gb, gpu_mem_reserved_gb, throughput_sps, tflops, mfu,
			       greatest(gpu_mem_used_gb, gpu_mem_peak_gb) AS mem,
			       coalesce(forward_ms + backward_ms + coalesce(optimizer_ms, 0), step_ms - coalesce(comm_ms, 0), step_ms) AS busy
			FROM steps WHERE run_id = $1 AND step >= $2 AND ($3 < 0 OR rank = $3)
		), w AS (
			SELECT *, max(busy) OVER (PARTITION BY step) - busy AS wait FROM s
		)
		SELECT rank, count(*), min(step), max(step), min(time), max(time),
		       avg(step_ms), avg(forward_ms), avg(backward_ms), avg(optimizer_ms), avg(comm_ms), avg(comm_exposed_ms), avg(data_ms),
		       percentile_cont(0.5) WITHIN GROUP (ORDER BY step_ms), percentile_cont(0.95) WITHIN GROUP (ORDER BY step_ms),
		       avg(gpu_util_pct), avg(cpu_util_pct), avg(gpu_mem_used_gb), max(mem), avg(throughput_sps), avg(tflops), avg(mfu), avg(wait),
		       max(gpu_mem_used_gb), max(gpu_mem_peak_gb), max(gpu_mem_reserved_gb)
		FROM w GROUP BY rank ORDER BY rank`, runID, from, onlyRank)
	if err != nil {
		return nil, fmt.Errorf("store: steady state of %s: %w", runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SteadyRank, error) {
		var a SteadyRank
		err := r.Scan(&a.Rank, &a.Rows, &a.FirstStep, &a.LastStep, &a.FirstTime, &a.LastTime,
			&a.StepMS, &a.ForwardMS, &a.BackwardMS, &a.OptimizerMS, &a.CommMS, &a.CommExposedMS, &a.DataMS,
			&a.MedianStepMS, &a.P95StepMS, &a.GPUUtil, &a.CPUUtil, &a.GPUMemGB, &a.PeakGPUMemGB, &a.ThroughputSPS, &a.TFLOPS, &a.MFU, &a.WaitMS,
			&a.MaxGPUMemUsedGB, &a.AllocPeakGB, &a.ReservedPeakGB)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: steady state of %s: %w", runID, err)
	}
	return out, nil
}
