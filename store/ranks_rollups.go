package store

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Per-rank figures of a run from its rollups (docs/scale.md): what
// [Store.SteadyByRank] and [Store.RankSyncs] compute from every raw row,
// read instead from one whole-run rollup per rank and metric, less the
// rollups of the steps before the steady state. The work is a few rows a
// rank and metric, whatever the number of steps. Sums and counts are
// exact, so means are the raw rows' means over the steps from the steady
// state's first step rounded down to a whole block of 100; peaks are over
// the whole run; the medians of the raw path are not kept (see
// RankRollup).

// ExactRankRows is how many raw step rows (ranks × steps) the per-rank
// views read row by row; larger runs are read from rollups.
const ExactRankRows = 5000

// RawRankSteps is how many steps of one rank a median of its step time
// (steady-state detection, the stall limit) reads row by row; a longer
// rank is judged on its width-100 rollups.
const RawRankSteps = 2000

// rankRollupMetrics are the metrics RankRollups reads.
var rankRollupMetrics = []string{"step", "step_ms", "forward_ms", "backward_ms", "optimizer_ms", "comm_ms", "comm_exposed_ms", "data_ms",
	"gpu_util_pct", "cpu_util_pct", "gpu_mem_used_gb", "gpu_mem_peak_gb", "gpu_mem_reserved_gb", "throughput_sps",
	"tflops", "mfu", "sync_wait_ms", "input_wait_ms", "busy_ms", "lateness_ms", "last_arrival"}

// rankRollupSQL reads, for the ranks of run $1 (every rank when $4 < 0,
// else rank $4), each metric of $2: the whole-run rollup, and the sum and
// count of the blocks before step $3 (a multiple of 100), by widths.
var rankRollupSQL = `
WITH t AS (
	SELECT rank, metric, first_step, first_time, last_time, min, max, sum, count FROM metric_rollup_rows
	WHERE run_id = $1 AND width = 0 AND bucket = 0 AND metric = ANY($2) AND ($4 < 0 OR rank = $4)
), p AS (
	SELECT rank, metric, sum(sum) AS sum, sum(count)::bigint AS count, max(last_time) AS last_time FROM metric_rollups
	WHERE run_id = $1 AND metric = ANY($2) AND ($4 < 0 OR rank = $4) AND $3 > 0 AND ` + blocksBefore("$3") + `
	GROUP BY rank, metric
)
SELECT t.rank, t.metric, t.first_step, t.first_time, t.last_time, t.min, t.max,
       t.sum - coalesce(p.sum, 0), t.count - coalesce(p.count, 0), p.last_time
FROM t LEFT JOIN p USING (rank, metric) ORDER BY t.rank`

// blocksBefore is the condition on width and bucket that selects, of the
// rollups of one rank and metric, the blocks before step from (an integer
// multiple of 100), each step once: the widest buckets wholly before it,
// then the narrower ones up to it.
func blocksBefore(from string) string {
	return `(
	       (width = 10000 AND bucket < ` + from + ` / 10000)
	    OR (width = 1000 AND bucket >= ` + from + ` / 10000 * 10 AND bucket < ` + from + ` / 1000)
	    OR (width = 100 AND bucket >= ` + from + ` / 1000 * 10 AND bucket < ` + from + ` / 100))`
}

// RankRollup is one rank's figures over the steps from a first step on,
// from rollups.
//
// Its MedianStepMS is the mean step time and P95StepMS is nil; Sync's
// lateness, busy time and waits are means, LastPct the share of the
// steps the rank arrived last, and ClockOffsetMS nil.
type RankRollup struct {
	SteadyRank
	Sync RankSync
}

// RankRollups returns every rank's figures (onlyRank < 0) or one rank's
// over the steps from the block holding from on, with each rank's newest
// straggler score when scores is set.
func (s *Store) RankRollups(ctx context.Context, runID string, from int64, onlyRank int, scores bool) ([]RankRollup, error) {
	from = max(from, 0) / 100 * 100
	rows, err := s.pool.Query(ctx, rankRollupSQL, runID, rankRollupMetrics, from, onlyRank)
	if err != nil {
		return nil, fmt.Errorf("store: rank rollups of %s: %w", runID, err)
	}
	type acc struct {
		sum      float64
		n        int64
		min, max *float64
	}
	var out []RankRollup
	idx := map[int]int{}
	vals := []map[string]acc{}
	for rows.Next() {
		var rank int
		var metric string
		var firstStep int64
		var firstTime time.Time
		var lastTime, prefixLast *time.Time
		var mn, mx, sum *float64
		var n int64
		if err := rows.Scan(&rank, &metric, &firstStep, &firstTime, &lastTime, &mn, &mx, &sum, &n, &prefixLast); err != nil {
			rows.Close()
			return nil, fmt.Errorf("store: rank rollups of %s: %w", runID, err)
		}
		i, ok := idx[rank]
		if !ok {
			i = len(out)
			idx[rank] = i
			out = append(out, RankRollup{SteadyRank: SteadyRank{Rank: rank}, Sync: RankSync{Rank: rank}})
			vals = append(vals, map[string]acc{})
		}
		a := acc{n: n, min: mn, max: mx}
		if sum != nil {
			a.sum = *sum
		}
		vals[i][metric] = a
		if metric == "step" {
			out[i].SteadyRank.setSpan(n, from, firstStep, firstTime, lastTime, prefixLast, mx)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: rank rollups of %s: %w", runID, err)
	}
	mean := func(v map[string]acc, k string) *float64 {
		a, ok := v[k]
		if !ok || a.n <= 0 {
			return nil
		}
		m := a.sum / float64(a.n)
		return &m
	}
	peak := func(v map[string]acc, ks ...string) *float64 {
		var out *float64
		for _, k := range ks {
			if a, ok := v[k]; ok && a.max != nil && !math.IsNaN(*a.max) && (out == nil || *a.max > *out) {
				out = a.max
			}
		}
		return out
	}
	busiest := math.Inf(-1)
	busy := make([]*float64, len(out))
	for i := range out {
		v, r := vals[i], &out[i]
		r.StepMS, r.ForwardMS, r.BackwardMS = mean(v, "step_ms"), mean(v, "forward_ms"), mean(v, "backward_ms")
		r.OptimizerMS, r.CommMS, r.DataMS = mean(v, "optimizer_ms"), mean(v, "comm_ms"), mean(v, "data_ms")
		r.CommExposedMS = mean(v, "comm_exposed_ms")
		r.MedianStepMS = r.StepMS
		r.GPUUtil, r.CPUUtil, r.GPUMemGB = mean(v, "gpu_util_pct"), mean(v, "cpu_util_pct"), mean(v, "gpu_mem_used_gb")
		r.PeakGPUMemGB = peak(v, "gpu_mem_used_gb", "gpu_mem_peak_gb")
		r.MaxGPUMemUsedGB, r.AllocPeakGB, r.ReservedPeakGB = peak(v, "gpu_mem_used_gb"), peak(v, "gpu_mem_peak_gb"), peak(v, "gpu_mem_reserved_gb")
		r.ThroughputSPS, r.TFLOPS, r.MFU = mean(v, "throughput_sps"), mean(v, "tflops"), mean(v, "mfu")
		sy := &r.Sync
		sy.LatenessMS, sy.BusyMS, sy.SyncWaitMS = mean(v, "lateness_ms"), mean(v, "busy_ms"), mean(v, "sync_wait_ms")
		sy.MeanSyncWaitMS, sy.InputWaitMS = sy.SyncWaitMS, mean(v, "input_wait_ms")
		sy.Steps = v["lateness_ms"].n
		if l := mean(v, "last_arrival"); l != nil {
			pct := 100 * *l
			sy.LastPct = &pct
		}
		b := sy.BusyMS
		if b == nil && r.ForwardMS != nil && r.BackwardMS != nil {
			x := *r.ForwardMS + *r.BackwardMS
			if r.OptimizerMS != nil {
				x += *r.OptimizerMS
			}
			b = &x
		}
		if b != nil && finiteF(*b) {
			busy[i] = b
			busiest = max(busiest, *b)
		}
	}
	for i := range out {
		if busy[i] != nil {
			w := busiest - *busy[i]
			out[i].WaitMS = &w
		}
	}
	slices.SortFunc(out, func(a, b RankRollup) int { return a.Rank - b.Rank })
	if scores {
		if err := s.newestScores(ctx, runID, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// setSpan sets the rows and span of a rank's steps from step from (a
// multiple of 100) on, from the whole-run rollup of its steps (its first
// step and time, last time and highest step) less those of the blocks
// before from (prefixLast: the last time of those; nil for none).
func (r *SteadyRank) setSpan(n, from, firstStep int64, firstTime time.Time, lastTime, prefixLast *time.Time, mx *float64) {
	r.Rows, r.FirstStep, r.FirstTime = n, max(firstStep, from), firstTime
	if prefixLast != nil {
		r.FirstTime = *prefixLast
	}
	if lastTime != nil {
		r.LastTime = *lastTime
	}
	if mx != nil {
		r.LastStep = int64(*mx)
	}
}

func finiteF(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// newestScores sets each rank's newest straggler score from the run's
// score heads, one row a rank however many passes scored it.
func (s *Store) newestScores(ctx context.Context, runID string, out []RankRollup) error {
	heads, err := s.scoreHeads(ctx, runID)
	if err != nil {
		return err
	}
	for i, r := range out {
		if h, ok := heads[r.Rank]; ok {
			out[i].Sync.Score, out[i].Sync.ScoreStep = &h.Score, &h.Step
		}
	}
	return nil
}

// LatenessSource says what a run's lateness comes from, as
// [Store.RankSyncs] does, from its newest step of the lowest rank:
// "arrivals" (sync_ns), "waits" (sync_wait_ms only) or "".
func (s *Store) LatenessSource(ctx context.Context, runID string) (string, error) {
	var src string
	// The lowest rank and its last step from the rollups, so that only
	// the newest block of its rows is read.
	err := s.pool.QueryRow(ctx, `
		WITH r AS (
			SELECT rank, max::bigint AS last FROM metric_rollup_rows
			WHERE run_id = $1 AND width = $2 AND bucket = 0 AND metric = 'step' ORDER BY rank LIMIT 1
		)
		SELECT CASE WHEN s.sync_ns IS NOT NULL THEN 'arrivals' WHEN s.sync_wait_ms IS NOT NULL THEN 'waits' ELSE '' END
		FROM r CROSS JOIN LATERAL (
			SELECT sync_ns, sync_wait_ms FROM steps WHERE run_id = $1 AND rank = r.rank AND step >= r.last - 100
			ORDER BY step DESC, time DESC LIMIT 1
		) s`, runID, TotalWidth).Scan(&src)
	if err == pgx.ErrNoRows {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("store: lateness source of %s: %w", runID, err)
	}
	return src, nil
}

// StepRows estimates the raw step rows of a run (of one rank when rank >=
// 0) from step >= from on: how much a raw read would cost. It counts its
// whole-run rollups and, for the blocks waiting for a refresh, 100 rows a
// rank-block, so that a run loaded faster than it is rolled up is not
// taken for a small one (an upper bound: a block rewritten since its
// refresh counts twice).
func (s *Store) StepRows(ctx context.Context, runID string, from int64, rank int) (int64, error) {
	m, err := s.StepRowsOf(ctx, []RankFrom{{RunID: runID, Rank: rank, From: from}})
	return m[runID], err
}

// StepRowsOf is [Store.StepRows] of each of runs, keyed by run, in one
// statement.
func (s *Store) StepRowsOf(ctx context.Context, runs []RankFrom) (map[string]int64, error) {
	ids, ranks, steps := rankFromArrays(runs)
	// From as a float, as the statement of one run always took it.
	from := make([]float64, len(steps))
	for i, v := range steps {
		from[i] = float64(v)
	}
	rows, err := s.pool.Query(ctx, `
		SELECT x.run_id,
		       (SELECT coalesce(sum(count * greatest(0, least(1, (max - x.from_step + 1) / greatest(max - min + 1, 1)))), 0)::bigint
		        FROM metric_rollup_rows WHERE run_id = x.run_id AND width = 0 AND bucket = 0 AND metric = 'step' AND (x.rank < 0 OR rank = x.rank))
		     + (SELECT 100 * count(*) FROM rollup_dirty WHERE run_id = x.run_id AND block >= x.from_step / 100 AND (x.rank < 0 OR rank = x.rank))
		FROM unnest($1::text[], $2::int[], $3::float8[]) AS x(run_id, rank, from_step)`, ids, ranks, from)
	out, err := runCounts(rows, err)
	if err != nil {
		return nil, fmt.Errorf("store: step rows of %s: %w", runsWhat(ids), err)
	}
	return out, nil
}
