package query

import (
	"context"
	"log/slog"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// Compare reads a run's steady state from its summary (run_summaries,
// store/run_summaries.go), one row however many ranks and steps, rather
// than every rank's rollups. The summary is computed by the same code a
// read would run (computeSteady), by the background refresher after it
// refreshed the run's rollups, and by a read that finds none.

// summaryMaxStale is how long a read answers from a summary behind the
// rollups (saying by how much) before, on the primary, it computes the
// figures itself: the refresher recomputes summaries within a pass or
// two, so one this far behind has none keeping it.
const summaryMaxStale = 30 * time.Second

// summaryEvery is how often the refresher recomputes the summary of a run
// whose rollups it keeps refreshing (a live run); a run whose rollups
// have caught up is recomputed on the next pass.
const summaryEvery = 5 * time.Second

// refresherSummaries bounds the summaries one refresher pass recomputes.
const refresherSummaries = 100

// summarize folds the steady aggregates of a run of ranks (sorted) into its
// summary, as compare shows them: means over the ranks that have a figure, peaks
// over them, throughput summed, the window from the earliest first step
// to the latest last.
func summarize(ranks []int, from, rows int64, agg []store.SteadyRank) store.SteadySummary {
	s := store.SteadySummary{Ranks: len(ranks), Rows: rows, From: from}
	if len(ranks) > 0 {
		s.LowestRank = ranks[0]
	}
	s.WindowFrom, s.WindowTo = steadyWindow(agg)
	s.GPUMemGB = meanOf(agg, func(a store.SteadyRank) *float64 { return a.GPUMemGB })
	s.MaxGPUMemUsedGB = maxOf(agg, func(a store.SteadyRank) *float64 { return a.MaxGPUMemUsedGB })
	s.AllocPeakGB = maxOf(agg, func(a store.SteadyRank) *float64 { return a.AllocPeakGB })
	s.ReservedPeakGB = maxOf(agg, func(a store.SteadyRank) *float64 { return a.ReservedPeakGB })
	s.GPUUtil = meanOf(agg, func(a store.SteadyRank) *float64 { return a.GPUUtil })
	s.CPUUtil = meanOf(agg, func(a store.SteadyRank) *float64 { return a.CPUUtil })
	s.StepMS = meanOf(agg, func(a store.SteadyRank) *float64 { return a.StepMS })
	s.StepsPerS = meanOf(agg, func(a store.SteadyRank) *float64 {
		d := a.LastTime.Sub(a.FirstTime).Seconds()
		if a.LastStep <= a.FirstStep || d <= 0 {
			return nil
		}
		v := float64(a.LastStep-a.FirstStep) / d
		return &v
	})
	for _, a := range agg {
		if a.ThroughputSPS != nil {
			if s.ThroughputSPS == nil {
				s.ThroughputSPS = new(float64)
			}
			*s.ThroughputSPS += *a.ThroughputSPS
		}
	}
	s.CommMS = meanOf(agg, func(a store.SteadyRank) *float64 { return a.CommMS })
	s.CommExposedMS = meanOf(agg, func(a store.SteadyRank) *float64 { return a.CommExposedMS })
	s.TFLOPS = meanOf(agg, func(a store.SteadyRank) *float64 { return a.TFLOPS })
	s.MFU = meanOf(agg, func(a store.SteadyRank) *float64 { return a.MFU })
	return s
}

// computeSteady computes a run's summary from st as the rollups (and, for
// a small run, the raw rows) are: the steady state's first step from the
// lowest rank's step times, then every rank's aggregates from it on, row
// by row for a small run and from the rollups for a large one (see
// Handler.steadyRanks). It refreshes nothing.
func computeSteady(ctx context.Context, st *store.Store, runID string) (store.SteadySummary, error) {
	r, err := st.GetRun(ctx, runID)
	if err != nil {
		return store.SteadySummary{}, err
	}
	ranks, err := st.RunRanks(ctx, runID)
	if err != nil || len(ranks) == 0 {
		return store.SteadySummary{}, err
	}
	pts, err := st.StepMSTimeline(ctx, runID, ranks[0], store.RawRankSteps)
	if err != nil {
		return store.SteadySummary{}, err
	}
	from := steadyStart(pts)
	n, err := st.StepRows(ctx, runID, from, -1)
	if err != nil {
		return store.SteadySummary{}, err
	}
	var agg []store.SteadyRank
	if n > store.ExactRankRows {
		rr, err := st.RankRollups(ctx, runID, from, -1, false)
		if err != nil {
			return store.SteadySummary{}, err
		}
		agg = steadyOf(rr)
	} else if agg, err = st.SteadyByRank(ctx, runID, from, -1); err != nil {
		return store.SteadySummary{}, err
	}
	sum := summarize(ranks, from, n, agg)
	// The stamp first: a GPU sample that lands meanwhile leaves the
	// figures behind it.
	if sum.GPUStamp, err = st.GPUStamp(ctx, runID); err != nil {
		return store.SteadySummary{}, err
	}
	if r.Status != api.StatusRunning {
		// A running run's stalls grow with the clock.
		w, err := st.WastedGPUHoursOf(ctx, runID, sum.Ranks, sum.LowestRank, false, time.Now(), store.DefaultWasteRules)
		if err != nil {
			return store.SteadySummary{}, err
		}
		sum.Wasted = &w
	}
	if sum.GPUMemGB == nil || sum.GPUUtil == nil {
		// What fillMeasured reads of the GPU samples.
		if sum.GPU, err = st.GPUSampleStats(ctx, runID, sum.WindowFrom, sum.WindowTo); err != nil {
			return store.SteadySummary{}, err
		}
		if sum.GPU.Samples == 0 && sum.GPU.UtilSamples == 0 {
			if sum.GPURun, err = st.GPUSampleStats(ctx, runID, zeroTime, zeroTime); err != nil {
				return store.SteadySummary{}, err
			}
		}
	}
	return sum, nil
}

// compareSteadies returns each of runIDs' steady-state summary for
// compare (its GPU figures and wasted GPU-hours only where they hold for
// the samples there are now): the stored one when it was computed from
// the rollups as they are, or, for a run read from its rollups (too
// large to read row by row), when it is less than summaryMaxStale behind
// them (the answer then says how far, as rollup_lag); else it refreshes
// the rollups as any read does, computes the summary and, on the
// primary, stores it for the next read. The backlogs, stored summaries
// and GPU stamps of every run are read together; a summary computed
// afresh is computed run by run.
func (h *Handler) compareSteadies(ctx context.Context, runIDs []string) (map[string]store.SteadySummary, error) {
	// The backlogs first: a refresh that clears one after this read has
	// made the summary read next behind.
	bs, err := h.store.RollupBacklogs(ctx, runIDs)
	if err != nil {
		return nil, err
	}
	stored, err := h.store.RunSummaries(ctx, runIDs)
	if err != nil {
		return nil, err
	}
	out := make(map[string]store.SteadySummary, len(runIDs))
	var stamped []string
	for _, id := range runIDs {
		sum := stored[id]
		if sum == nil || !sum.Computed {
			continue
		}
		b := bs[id]
		lag := sum.Lag(b)
		exact := sum.Current && b.Blocks == 0
		large := sum.Rows > store.ExactRankRows
		if exact || (large && (h.reading() || lag.Behind(time.Now()) < summaryMaxStale)) {
			noteBacklog(ctx, id, lag)
			out[id] = sum.SteadySummary
			if sum.GPU != nil || sum.Wasted != nil {
				stamped = append(stamped, id)
			}
		}
	}
	if len(stamped) > 0 {
		// Samples that arrived since are read afresh.
		stamps, err := h.store.GPUStamps(ctx, stamped)
		if err != nil {
			return nil, err
		}
		for _, id := range stamped {
			if sum := out[id]; stamps[id] != sum.GPUStamp {
				sum.GPU, sum.GPURun, sum.Wasted = nil, nil, nil
				out[id] = sum
			}
		}
	}
	for _, id := range runIDs {
		if _, ok := out[id]; ok {
			continue
		}
		if out[id], err = h.freshSteady(ctx, id); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// freshSteady refreshes the run's rollups, computes its summary and, on
// the primary, stores it (see compareSteadies).
func (h *Handler) freshSteady(ctx context.Context, runID string) (store.SteadySummary, error) {
	if err := h.refreshRollups(ctx, runID); err != nil {
		return store.SteadySummary{}, err
	}
	gen, err := h.store.SummaryGen(ctx, runID)
	if err != nil {
		return store.SteadySummary{}, err
	}
	s, err := computeSteady(ctx, h.store, runID)
	if err != nil {
		return store.SteadySummary{}, err
	}
	if !h.reading() {
		if _, err := h.store.PutRunSummary(ctx, runID, gen, s); err != nil {
			return store.SteadySummary{}, err
		}
	}
	return s, nil
}

// summarizeRuns recomputes the summaries of the runs whose rollups a
// refresh changed (store.StaleSummaries), for a pass of the background
// refresher, and reports whether some were left for the next pass.
func summarizeRuns(ctx context.Context, st *store.Store, log *slog.Logger) (more bool) {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	ids, err := st.StaleSummaries(lctx, refresherSummaries, summaryEvery)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("list run summaries to recompute", "err", err)
		}
		return false
	}
	for _, id := range ids {
		if ctx.Err() != nil {
			return false
		}
		sctx, cancel := context.WithTimeout(ctx, refresherStatement)
		err := summarizeRun(sctx, st, id)
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("recompute run summary", "run_id", id, "err", err)
		}
	}
	return len(ids) == refresherSummaries
}

// summarizeRun recomputes one run's summary from its rollups as they are
// and stores it, unless a refresh changed them meanwhile.
func summarizeRun(ctx context.Context, st *store.Store, runID string) error {
	gen, err := st.SummaryGen(ctx, runID)
	if err != nil {
		return err
	}
	s, err := computeSteady(ctx, st, runID)
	if err != nil {
		return err
	}
	_, err = st.PutRunSummary(ctx, runID, gen, s)
	return err
}
