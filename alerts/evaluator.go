package alerts

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/deepseed/deepseed/store"
)

// lockKey is the advisory lock that elects the one server evaluating
// detectors at a time ("dsalerts" in ASCII).
const lockKey int64 = 0x6473616c65727473

// maxRuns bounds the runs one pass visits: the running ones seen in the
// last day and those with open alerts, the most recently seen first.
const maxRuns = 500

// Evaluator runs the detectors over a store.
type Evaluator struct {
	Store  *store.Store
	Config Config
	Log    *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Run evaluates every interval until ctx is done. Several servers may run
// it: a pass runs only on the one holding the advisory lock.
func (e *Evaluator) Run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = 5 * time.Second
	}
	log := e.logger()
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := e.Pass(ctx); err != nil && ctx.Err() == nil {
			log.Warn("evaluate detectors", "err", err)
		}
		t.Reset(every)
	}
}

func (e *Evaluator) logger() *slog.Logger {
	if e.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return e.Log.With("component", "alerts")
}

func (e *Evaluator) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// Pass evaluates every candidate run once and reports whether this server
// held the lock (false: another server evaluates).
func (e *Evaluator) Pass(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	held, err := e.Store.WithSessionLock(ctx, lockKey, func(ctx context.Context) error {
		runs, err := e.Store.AlertCandidates(ctx, maxRuns)
		if err != nil {
			return fmt.Errorf("alerts: list runs: %w", err)
		}
		for _, r := range runs {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err := e.evalRun(ctx, r.RunID, r.Running, e.Config.withMeta(r.Meta)); err != nil {
				e.logger().Warn("evaluate run", "run_id", r.RunID, "err", err)
			}
		}
		return nil
	})
	if err != nil && !held {
		return false, fmt.Errorf("alerts: %w", err)
	}
	return held, err
}

func (e *Evaluator) evalRun(ctx context.Context, runID string, running bool, cfg Config) error {
	ranks, err := e.Store.RunRanks(ctx, runID)
	if err != nil {
		return err
	}
	byRank, err := recentSteps(ctx, e.Store, runID, ranks, max(cfg.Window, cfg.SpikeWindow+1, cfg.NonFiniteSteps))
	if err != nil {
		return err
	}
	now := e.now()
	fs := detectSteps(cfg, byRank, running, now)
	newest, scored, err := scoreRanks(ctx, e.Store, runID, byRank, cfg)
	if err != nil {
		return err
	}
	fs = append(fs, detectStragglers(cfg, newest, scored)...)
	hangs, err := recentHangs(ctx, e.Store, runID, newestStepTime(byRank))
	if err != nil {
		return err
	}
	fs = append(fs, detectHang(hangs, byRank)...)
	if running {
		gpus, err := recentGPUs(ctx, e.Store, runID, cfg)
		if err != nil {
			return err
		}
		fs = append(fs, detectIdle(cfg, gpus)...)
	}
	return reconcile(ctx, e.Store, runID, fs)
}

// recentSteps reads each rank's newest n steps, newest first. The ranks
// come from the store (its rollup tables, not the steps), and each rank's
// rows from a backward scan of the steps' unique index: a bounded read
// however long the run.
func recentSteps(ctx context.Context, st *store.Store, runID string, ranks []int, n int) (map[int][]stepRow, error) {
	rows, err := st.RecentSteps(ctx, runID, ranks, n)
	if err != nil {
		return nil, fmt.Errorf("alerts: %w", err)
	}
	out := map[int][]stepRow{}
	for _, s := range rows {
		out[s.Rank] = append(out[s.Rank], stepRow(s))
	}
	return out, nil
}

// recentGPUs reads each GPU's samples of the run over the last idle span
// plus a margin, before its newest sample, through the gpu_samples_run
// index.
func recentGPUs(ctx context.Context, st *store.Store, runID string, cfg Config) ([]gpuState, error) {
	span := time.Duration(cfg.IdleFor)*2 + time.Minute
	rows, err := st.RecentGPUActivity(ctx, runID, span, cfg.IdleUtilPct)
	if err != nil {
		return nil, fmt.Errorf("alerts: %w", err)
	}
	var out []gpuState
	for _, r := range rows {
		g := gpuState{Host: r.Host, GPU: r.GPU, Rank: r.Rank, Last: r.Last, IdleSince: r.First, LastUtil: r.LastUtil}
		if r.LastBusy != nil {
			g.IdleSince = *r.LastBusy
		}
		out = append(out, g)
	}
	return out, nil
}
