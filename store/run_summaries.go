package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Run summaries (run_summaries, migrations/0016_run_summaries.sql): the
// figures compare shows of a run's steady state, aggregated over its
// ranks, kept by the rollup refresher so that a read takes one row a run
// however many ranks and steps it has.

// SteadySummary is a run's steady state over its ranks: its first step,
// the raw rows in it, its time range and the aggregates over ranks of
// each rank's figures (means of the ranks' means, the highest of the
// ranks' peaks, the ranks' throughput summed). A nil figure is one no
// rank had.
type SteadySummary struct {
	Ranks, LowestRank                      int
	Rows                                   int64
	From                                   int64
	WindowFrom, WindowTo                   time.Time
	StepMS, StepsPerS, ThroughputSPS       *float64
	GPUMemGB, MaxGPUMemUsedGB, AllocPeakGB *float64
	ReservedPeakGB, GPUUtil, CPUUtil       *float64
	CommMS, CommExposedMS, TFLOPS, MFU     *float64
	// GPU and GPURun are the run's GPU samples in the window and, when
	// none fell in it, over the whole run, as they were when the run had
	// GPUStamp of them ([Store.GPUStamp]); nil when not computed.
	GPU, GPURun *GPUSampleStats
	GPUStamp    int64
	// Wasted is a finished run's wasted GPU-hours, which hold with the
	// rollups and GPU samples as they were; nil when not computed.
	Wasted *Wasted
}

// StoredSummary is a run's row of run_summaries.
type StoredSummary struct {
	SteadySummary
	// Current is set when the figures were computed from the rollups as
	// they are now (summary_gen = rollup_gen).
	Current bool
	// Gen is the rollups' generation now; StaleSince and StaleBlocks say,
	// when not Current, since when and over how many rank-blocks refreshed
	// the figures are behind the rollups.
	Gen         int64
	StaleSince  time.Time
	StaleBlocks int64
	// Computed is false while the row only counts refreshes (no summary
	// was computed yet).
	Computed bool
}

// Lag is the backlog a reader of s says it answers behind by, given the
// run's rollup backlog b: b's blocks plus those refreshed since the
// summary, since the older of the two.
func (s *StoredSummary) Lag(b RollupBacklog) RollupBacklog {
	if s.Current {
		return b
	}
	out := RollupBacklog{Blocks: b.Blocks + max(s.StaleBlocks, 1), Since: s.StaleSince}
	if b.Blocks > 0 && (out.Since.IsZero() || b.Since.Before(out.Since)) {
		out.Since = b.Since
	}
	return out
}

const summaryColumns = `ranks, lowest_rank, rows, steady_from, window_from, window_to, step_ms, steps_per_s, throughput_sps, gpu_mem_gb,
	gpu_mem_used_peak_gb, alloc_peak_gb, reserved_peak_gb, gpu_util_pct, cpu_util_pct, comm_ms, comm_exposed_ms, tflops, mfu,
	gpu_stamp, gpu_window, gpu_run, wasted`

// bumpSummaryGen, in a rollup refresh's transaction, marks the run's
// summary as behind the rollups it is about to commit, by blocks
// rank-blocks.
func bumpSummaryGen(ctx context.Context, tx pgx.Tx, runID string, blocks int) error {
	if _, err := tx.Exec(ctx, `
		INSERT INTO run_summaries AS s (run_id, rollup_gen, stale_since, stale_blocks) VALUES ($1, 1, now(), $2)
		ON CONFLICT (run_id) DO UPDATE SET rollup_gen = s.rollup_gen + 1,
			stale_since = CASE WHEN s.summary_gen = s.rollup_gen THEN now() ELSE coalesce(s.stale_since, now()) END,
			stale_blocks = CASE WHEN s.summary_gen = s.rollup_gen THEN 0 ELSE s.stale_blocks END + $2`, runID, blocks); err != nil {
		return fmt.Errorf("mark run summary behind: %w", err)
	}
	return nil
}

// RunSummary returns the run's stored summary, nil when it has none.
func (s *Store) RunSummary(ctx context.Context, runID string) (*StoredSummary, error) {
	m, err := s.RunSummaries(ctx, []string{runID})
	return m[runID], err
}

// RunSummaries is [Store.RunSummary] of each of runIDs, in one statement;
// a run without a stored summary has no entry.
func (s *Store) RunSummaries(ctx context.Context, runIDs []string) (map[string]*StoredSummary, error) {
	rows, err := s.pool.Query(ctx, `SELECT run_id, rollup_gen, summary_gen, stale_since, stale_blocks, summarized_at, `+summaryColumns+`
		FROM run_summaries WHERE run_id = ANY($1)`, runIDs)
	if err != nil {
		return nil, fmt.Errorf("store: summary of %s: %w", runsWhat(runIDs), err)
	}
	defer rows.Close()
	out := map[string]*StoredSummary{}
	for rows.Next() {
		id, sum, err := scanSummary(rows)
		if err != nil {
			return nil, fmt.Errorf("store: summary of %s: %w", runsWhat(runIDs), err)
		}
		out[id] = sum
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: summary of %s: %w", runsWhat(runIDs), err)
	}
	return out, nil
}

// scanSummary reads a row of run_summaries: its run id, then its
// generations and summaryColumns.
func scanSummary(row pgx.Row) (string, *StoredSummary, error) {
	var id string
	var out StoredSummary
	var summaryGen int64
	var staleSince, summarized, wf, wt *time.Time
	var ranks, lowest *int
	var rows, from, stamp *int64
	x := &out.SteadySummary
	if err := row.Scan(&id, &out.Gen, &summaryGen, &staleSince, &out.StaleBlocks, &summarized,
		&ranks, &lowest, &rows, &from, &wf, &wt, &x.StepMS, &x.StepsPerS, &x.ThroughputSPS, &x.GPUMemGB,
		&x.MaxGPUMemUsedGB, &x.AllocPeakGB, &x.ReservedPeakGB, &x.GPUUtil, &x.CPUUtil, &x.CommMS, &x.CommExposedMS, &x.TFLOPS, &x.MFU,
		&stamp, &x.GPU, &x.GPURun, &x.Wasted); err != nil {
		return "", nil, err
	}
	out.Current = summaryGen == out.Gen
	out.Computed = summarized != nil
	if staleSince != nil {
		out.StaleSince = *staleSince
	}
	if ranks != nil {
		x.Ranks = *ranks
	}
	if lowest != nil {
		x.LowestRank = *lowest
	}
	if rows != nil {
		x.Rows = *rows
	}
	if from != nil {
		x.From = *from
	}
	if wf != nil {
		x.WindowFrom = *wf
	}
	if stamp != nil {
		x.GPUStamp = *stamp
	}
	if wt != nil {
		x.WindowTo = *wt
	}
	return id, &out, nil
}

// SummaryGen returns the generation of the run's rollups: read it before
// computing a summary and hand it to [Store.PutRunSummary].
func (s *Store) SummaryGen(ctx context.Context, runID string) (int64, error) {
	var gen int64
	err := s.pool.QueryRow(ctx, `SELECT rollup_gen FROM run_summaries WHERE run_id = $1`, runID).Scan(&gen)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("store: summary generation of %s: %w", runID, err)
	}
	return gen, nil
}

// PutRunSummary stores sum as the run's summary computed from the
// rollups of generation gen, unless a refresh has changed them since (it
// then reports false and the summary stays behind, for the next
// recompute).
func (s *Store) PutRunSummary(ctx context.Context, runID string, gen int64, sum SteadySummary) (bool, error) {
	tag, err := s.pool.Exec(ctx, `
		INSERT INTO run_summaries AS s (run_id, rollup_gen, summary_gen, summarized_at, `+summaryColumns+`)
		SELECT $1, $2, $2, now(), $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25
		WHERE EXISTS (SELECT 1 FROM runs WHERE run_id = $1) -- not for a run just deleted
		ON CONFLICT (run_id) DO UPDATE SET summary_gen = EXCLUDED.summary_gen, summarized_at = EXCLUDED.summarized_at,
			stale_since = NULL, stale_blocks = 0,
			ranks = EXCLUDED.ranks, lowest_rank = EXCLUDED.lowest_rank, rows = EXCLUDED.rows, steady_from = EXCLUDED.steady_from,
			window_from = EXCLUDED.window_from, window_to = EXCLUDED.window_to, step_ms = EXCLUDED.step_ms,
			steps_per_s = EXCLUDED.steps_per_s, throughput_sps = EXCLUDED.throughput_sps, gpu_mem_gb = EXCLUDED.gpu_mem_gb,
			gpu_mem_used_peak_gb = EXCLUDED.gpu_mem_used_peak_gb, alloc_peak_gb = EXCLUDED.alloc_peak_gb,
			reserved_peak_gb = EXCLUDED.reserved_peak_gb, gpu_util_pct = EXCLUDED.gpu_util_pct, cpu_util_pct = EXCLUDED.cpu_util_pct,
			comm_ms = EXCLUDED.comm_ms, comm_exposed_ms = EXCLUDED.comm_exposed_ms, tflops = EXCLUDED.tflops, mfu = EXCLUDED.mfu,
			gpu_stamp = EXCLUDED.gpu_stamp, gpu_window = EXCLUDED.gpu_window, gpu_run = EXCLUDED.gpu_run,
			wasted = EXCLUDED.wasted
		WHERE s.rollup_gen = EXCLUDED.rollup_gen`,
		runID, gen, sum.Ranks, sum.LowestRank, sum.Rows, sum.From, nullTime(sum.WindowFrom), nullTime(sum.WindowTo), sum.StepMS, sum.StepsPerS,
		sum.ThroughputSPS, sum.GPUMemGB, sum.MaxGPUMemUsedGB, sum.AllocPeakGB, sum.ReservedPeakGB, sum.GPUUtil, sum.CPUUtil,
		sum.CommMS, sum.CommExposedMS, sum.TFLOPS, sum.MFU, sum.GPUStamp, finiteGPU(sum.GPU), finiteGPU(sum.GPURun),
		finiteWasted(sum.Wasted))
	if err != nil {
		return false, fmt.Errorf("store: store summary of %s: %w", runID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// StaleSummaries lists up to limit runs whose summaries are behind their
// rollups, the longest behind first: those behind by more than minAge,
// and those whose rollups have no markers left (a load that ended).
func (s *Store) StaleSummaries(ctx context.Context, limit int, minAge time.Duration) ([]string, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT run_id FROM run_summaries s WHERE summary_gen <> rollup_gen
		  AND (stale_since IS NULL OR stale_since <= now() - make_interval(secs => $2)
		       OR NOT EXISTS (SELECT 1 FROM rollup_dirty d WHERE d.run_id = s.run_id))
		ORDER BY stale_since NULLS FIRST, run_id LIMIT $1`, limit, minAge.Seconds())
	if err != nil {
		return nil, fmt.Errorf("store: stale run summaries: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: stale run summaries: %w", err)
	}
	return ids, nil
}

// finiteGPU is g when JSON holds it exactly (every figure finite), else
// nil: a reader then reads the samples.
func finiteGPU(g *GPUSampleStats) *GPUSampleStats {
	if g == nil {
		return nil
	}
	for _, v := range []*float64{g.PeakMemBytes, g.MeanMemBytes, g.MeanUtil, g.TotalMemBytes} {
		if v != nil && !finiteF(*v) {
			return nil
		}
	}
	return g
}

// finiteWasted is w when JSON holds it exactly, else nil.
func finiteWasted(w *Wasted) *Wasted {
	if w == nil {
		return nil
	}
	for _, v := range []float64{w.IdleGPUH, w.StragglerGPUH, w.StalledGPUH, w.SkippedGPUH, w.TotalGPUH} {
		if !finiteF(v) {
			return nil
		}
	}
	return w
}

// GPUStamp counts the GPU samples attributed to the run (gpu_minutes,
// whose counts only grow as samples arrive): a summary's GPU figures
// hold while it is unchanged.
func (s *Store) GPUStamp(ctx context.Context, runID string) (int64, error) {
	m, err := s.GPUStamps(ctx, []string{runID})
	return m[runID], err
}

// GPUStamps is [Store.GPUStamp] of each of runIDs, in one statement.
// Every id has an entry.
func (s *Store) GPUStamps(ctx context.Context, runIDs []string) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, `SELECT run_id, coalesce(sum(samples), 0)::bigint + count(*) FROM gpu_minutes
		WHERE run_id = ANY($1) GROUP BY run_id`, runIDs)
	out, err := runCounts(rows, err)
	if err != nil {
		return nil, fmt.Errorf("store: gpu samples of %s: %w", runsWhat(runIDs), err)
	}
	for _, id := range runIDs {
		if _, ok := out[id]; !ok {
			out[id] = 0 // every id has an entry
		}
	}
	return out, nil
}

// runCounts collects rows of (run id, count) into a map, the query's
// error first: the shape of the batched reads that count something of
// each run.
func runCounts(rows pgx.Rows, err error) (map[string]int64, error) {
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for rows.Next() {
		var id string
		var n int64
		if err := rows.Scan(&id, &n); err != nil {
			rows.Close()
			return nil, err
		}
		out[id] = n
	}
	rows.Close()
	return out, rows.Err()
}
