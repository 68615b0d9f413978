package query

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/deepseed/deepseed/internal/tick"
	"github.com/deepseed/deepseed/store"
)

// Refresher bounds: a pass visits at most refresherRuns runs and gives
// each at most refresherBlocks blocks (whole chunks, 1,000,000 steps of a
// rank), so one huge cold run cannot starve the others for long.
const (
	refresherRuns   = 100
	refresherBlocks = 2000
)

// refresherStatement bounds each statement of a background refresh at
// first; each time a run's chunk is cancelled for it the run's bound
// doubles, up to refresherStatementMax, so that a chunk that truly needs
// longer (a slow disk, compressed chunks) still gets through.
const (
	refresherStatement    = 2 * time.Minute
	refresherStatementMax = 16 * time.Minute
)

// RunRefresher keeps rollups up to date in the background, so that reads
// rarely pay for a cold refresh: every interval it refreshes the runs with
// rollup markers, the longest waiting first, and while work remains it goes
// on without waiting. It returns when ctx is done. Readers may refresh the
// same run at the same time: refreshes of one run take turns on the
// store's per-run lock and each marker is taken once.
func RunRefresher(ctx context.Context, st *store.Store, every time.Duration, log *slog.Logger) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "rollup-refresher")
	bounds := map[string]time.Duration{}
	// GPU minutes are closed on a loop of their own, so that a long
	// refresh pass holds no GPU minute open (store/samples_gpu_close.go).
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { tick.Loop(ctx, closeEvery, true, closePass(st, log)) })
	tick.Loop(ctx, every, true, func(ctx context.Context) bool { return refreshPass(ctx, st, log, bounds) })
}

// closeEvery is how often the refresher closes the GPU minutes that are
// over; readers take the samples of those still open.
const closeEvery = 15 * time.Second

// closePass is one pass of the refresher's GPU minute loop.
func closePass(st *store.Store, log *slog.Logger) func(ctx context.Context) bool {
	return func(ctx context.Context) bool {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		hosts, more, err := st.CloseGPUMinutes(cctx)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("close GPU minutes", "err", err)
			}
			return false
		}
		if hosts > 0 {
			log.Debug("closed GPU minutes", "hosts", hosts, "more", more)
		}
		return more
	}
}

// refreshPass refreshes a bounded amount of every dirty run and reports
// whether work was left. bounds holds the statement bound of the runs
// whose chunks were cancelled for it.
func refreshPass(ctx context.Context, st *store.Store, log *slog.Logger, bounds map[string]time.Duration) (more bool) {
	// Statistics first: a refresh planned on the statistics of before a
	// bulk load can run for minutes (store/analyze.go).
	actx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	_, err := st.AnalyzeStale(actx)
	cancel()
	if err != nil && ctx.Err() == nil {
		log.Warn("analyze tables changed in bulk", "err", err)
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	runs, err := st.DirtyRuns(lctx, refresherRuns)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("list runs to refresh", "err", err)
		}
		return false
	}
	if len(runs) == 0 {
		// The queue is drained: its file is cut back once it grew
		// (store/queue_vacuum.go).
		vctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, _, err := st.VacuumDrainedQueue(vctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("vacuum the drained rollup queue", "err", err)
		}
	}
	for _, r := range runs {
		if ctx.Err() != nil {
			return false
		}
		start := time.Now()
		// A chunk is one transaction of a few seconds at most; a statement
		// that runs past the run's bound (a plan gone wrong) is cancelled,
		// its chunk rolled back and left for the next pass, after the
		// statistics were looked at again, with twice the bound.
		bound := cmp.Or(bounds[r.RunID], refresherStatement)
		rctx, cancel := context.WithTimeout(ctx, 4*bound)
		n, left, err := st.RefreshRollupsWithin(rctx, r.RunID, store.RefreshLimits{MaxBlocks: refresherBlocks, Timeout: bound})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("refresh rollups", "run_id", r.RunID, "err", err)
			}
			continue
		}
		took := time.Since(start)
		if left && n == 0 {
			bounds[r.RunID] = min(2*bound, refresherStatementMax)
			log.Warn("rollup refresh cancelled after its statement timeout; left for the next pass, with a longer one", "run_id", r.RunID,
				"timeout", bound.String(), "next_timeout", bounds[r.RunID].String(), "took", took)
		} else if n > 0 {
			delete(bounds, r.RunID)
		}
		if left {
			more = true
			log.Info("refreshing rollups", "run_id", r.RunID, "blocks", n,
				"blocks_left", max(r.Blocks-int64(n), 1), "took", took)
		} else if r.Blocks > refresherBlocks || took > time.Second {
			log.Info("refreshed rollups", "run_id", r.RunID, "blocks", n, "took", took,
				"waited", time.Since(r.Since))
		} else {
			log.Debug("refreshed rollups", "run_id", r.RunID, "blocks", n, "took", took)
		}
	}
	// The summaries of the runs refreshed (compare_summary.go).
	return summarizeRuns(ctx, st, log) || more
}
