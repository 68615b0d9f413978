package store

import (
	"context"
	"fmt"
	"strings"
)

// Whole-run figures of runs for their summaries, read for a page of runs
// in a few statements whatever its size: the summaries of the runs list
// read them with one array of run ids, a run's own summary with one id.

// RunStats are whole-run figures from the rollups (refresh them first).
type RunStats struct {
	Rows          int64 // rows of the lowest rank
	FirstStep     *int64
	LastStep      *int64
	Skipped       int64
	MeanThroughpt *float64
	MeanGPUUtil   *float64
	PeakGPUMemGB  *float64 // device memory in use the steps carried (gpu_mem_used_gb)
	AllocPeakGB   *float64 // the allocator's peak the steps carried (gpu_mem_peak_gb)
	MeanStepMS    *float64
	MeanTFLOPS    *float64 // achieved model TFLOP/s per GPU
	MeanMFU       *float64 // model FLOPs utilisation, 0..1
	FinalLoss     *float64
	UserMetrics   []string
}

// RunStats computes whole-run figures over all ranks from the widest
// rollups, and the final loss of the lowest rank from the raw rows.
func (s *Store) RunStats(ctx context.Context, runID string) (*RunStats, error) {
	m, err := s.RunStatsOf(ctx, []string{runID})
	if err != nil {
		return nil, err
	}
	return m[runID], nil
}

// RunStatsOf is [Store.RunStats] of each of runIDs, in three statements:
// the spread of every metric over the whole run (the aggregate over every
// rank, rollups_spread.go), the steps and span of each run's lowest rank,
// and that rank's newest loss. Every id has an entry, zero for a run
// without rollups.
func (s *Store) RunStatsOf(ctx context.Context, runIDs []string) (map[string]*RunStats, error) {
	what := runsWhat(runIDs)
	out := make(map[string]*RunStats, len(runIDs))
	for _, id := range runIDs {
		out[id] = &RunStats{}
	}
	type agg struct {
		min, max, sum *float64
		n             int64
	}
	aggs := make(map[string]map[string]agg, len(runIDs))
	rows, err := s.pool.Query(ctx, `
		SELECT run_id, metric, min, max, sum, count FROM metric_spread
		WHERE run_id = ANY($1) AND width = $2 AND bucket = 0 ORDER BY run_id, metric`, runIDs, TotalWidth)
	if err != nil {
		return nil, fmt.Errorf("store: run stats of %s: %w", what, err)
	}
	for rows.Next() {
		var id, name string
		var a agg
		if err := rows.Scan(&id, &name, &a.min, &a.max, &a.sum, &a.n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("store: run stats of %s: %w", what, err)
		}
		st := out[id]
		if st == nil {
			continue
		}
		if aggs[id] == nil {
			aggs[id] = map[string]agg{}
		}
		aggs[id][name] = a
		if strings.HasPrefix(name, "metrics.") {
			st.UserMetrics = append(st.UserMetrics, name)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: run stats of %s: %w", what, err)
	}
	for id, m := range aggs {
		mean := func(k string) *float64 {
			a, ok := m[k]
			if !ok || a.n == 0 || a.sum == nil {
				return nil
			}
			v := *a.sum / float64(a.n)
			return &v
		}
		st := out[id]
		if a, ok := m["skipped"]; ok && a.sum != nil {
			st.Skipped = int64(*a.sum)
		}
		st.MeanThroughpt = mean("throughput_sps")
		st.MeanGPUUtil = mean("gpu_util_pct")
		st.MeanStepMS = mean("step_ms")
		st.MeanTFLOPS = mean("tflops")
		st.MeanMFU = mean("mfu")
		st.PeakGPUMemGB = m["gpu_mem_used_gb"].max
		st.AllocPeakGB = m["gpu_mem_peak_gb"].max
	}
	// Steps and span of the lowest rank of each run.
	rows, err = s.pool.Query(ctx, `
		SELECT x.run_id, r.rank, r.count, r.min::bigint, r.max::bigint FROM unnest($1::text[]) AS x(run_id)
		CROSS JOIN LATERAL (
			SELECT rank, count, min, max FROM metric_rollup_rows
			WHERE run_id = x.run_id AND width = $2 AND bucket = 0 AND metric = 'step' ORDER BY rank LIMIT 1
		) r`, runIDs, TotalWidth)
	if err != nil {
		return nil, fmt.Errorf("store: run span of %s: %w", what, err)
	}
	var lossIDs []string
	var lossRanks []int
	var lossFrom []int64
	for rows.Next() {
		var id string
		var rank int
		var n int64
		var first, last *int64
		if err := rows.Scan(&id, &rank, &n, &first, &last); err != nil {
			rows.Close()
			return nil, fmt.Errorf("store: run span of %s: %w", what, err)
		}
		st := out[id]
		if st == nil {
			continue
		}
		st.Rows, st.FirstStep, st.LastStep = n, first, last
		from := int64(0)
		if last != nil {
			from = *last - 1000
		}
		lossIDs, lossRanks, lossFrom = append(lossIDs, id), append(lossRanks, rank), append(lossFrom, from)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: run span of %s: %w", what, err)
	}
	if len(lossIDs) == 0 {
		return out, nil
	}
	// The newest loss of the lowest rank, looked for in its last 1,000
	// steps first: on compressed chunks a step range reads a batch or
	// two, a whole rank's steps every batch.
	rows, err = s.pool.Query(ctx, `
		SELECT x.run_id, coalesce(
			(SELECT loss FROM steps WHERE run_id = x.run_id AND rank = x.rank AND step >= x.from_step AND loss IS NOT NULL
			 ORDER BY step DESC, time DESC LIMIT 1),
			(SELECT loss FROM steps WHERE run_id = x.run_id AND rank = x.rank AND step >= 0 AND loss IS NOT NULL
			 ORDER BY step DESC, time DESC LIMIT 1))
		FROM unnest($1::text[], $2::int[], $3::bigint[]) AS x(run_id, rank, from_step)`, lossIDs, lossRanks, lossFrom)
	if err != nil {
		return nil, fmt.Errorf("store: final loss of %s: %w", what, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var loss *float64
		if err := rows.Scan(&id, &loss); err != nil {
			return nil, fmt.Errorf("store: final loss of %s: %w", what, err)
		}
		out[id].FinalLoss = loss
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: final loss of %s: %w", what, err)
	}
	return out, nil
}

// runsWhat names runIDs in an error: the run, or how many.
func runsWhat(runIDs []string) string {
	if len(runIDs) == 1 {
		return runIDs[0]
	}
	return fmt.Sprintf("%d runs", len(runIDs))
}
