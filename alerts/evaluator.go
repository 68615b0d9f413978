// Package alerts runs the server's detectors: rules over the rows a run
// has already stored (steps, hang events, GPU samples) that open an alert
// when a training run goes wrong — a non-finite loss, an overflow storm, a
// loss spike, an idle GPU, a stalled run or rank, a starving input
// pipeline, a straggling rank, a hang — keep it single while the condition
// holds and resolve it when it clears. The detectors themselves are pure
// functions in package detect, listed in detect.Table; this package reads
// their rows, stores the straggler scores, keeps the alerts table and
// shows it on /metrics. The scores of a run it never evaluated, which the
// query server computes on read, are pure functions in detect too
// (detect.FinalScores, detect.ScoreSeries, detect.BlockScores), so that
// the query server does not depend on this package.
//
// The detectors run in a background evaluator (Run), never in the ingest
// path: every few seconds one server (an advisory lock elects it) reads
// the newest rows of each running run, a bounded amount per run, runs
// every detector of the table over them and reconciles the alerts table
// with what fires. The rows come from, and the alerts go to, the store's
// methods (store/alerts.go, steps.go, samples_gpu.go, events.go): this
// package holds no SQL.
package alerts

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/deepseed/deepseed/detect"
	"github.com/deepseed/deepseed/internal/tick"
	"github.com/deepseed/deepseed/store"
)

// lockKey is the advisory lock that elects the one server evaluating
// detectors at a time ("dsalerts" in ASCII).
const lockKey int64 = 0x6473616c65727473

// maxRuns bounds the runs one pass visits: the running ones seen in the
// last day, those with open alerts and those received in the last hour
// (store.AlertCandidates), the most recently received first.
const maxRuns = 500

// Evaluator runs the detectors over a store.
type Evaluator struct {
	Store  *store.Store
	Config detect.Config
	Log    *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Trends, when set, feeds the regression and drift detectors.
	Trends     Trends
	trendCache map[string]trendEntry
	// passes counts the passes Run completed on this server.
	passes atomic.Int64
}

// Run evaluates every interval until ctx is done. Several servers may run
// it: a pass runs only on the one holding the advisory lock.
func (e *Evaluator) Run(ctx context.Context, every time.Duration) {
	log := e.logger()
	tick.Loop(ctx, every, false, func(ctx context.Context) bool {
		held, err := e.Pass(ctx)
		if err != nil && ctx.Err() == nil {
			log.Warn("evaluate detectors", "err", err)
		}
		if held && err == nil {
			e.passes.Add(1)
		}
		return false
	})
}

// Passes is the number of passes Run has completed on this server, each
// over every candidate run: what a caller waits on to know that what was
// stored before has been evaluated.
func (e *Evaluator) Passes() int64 { return e.passes.Load() }

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
			if err := e.evalRun(ctx, r.RunID, r.Running, e.Config.WithMeta(r.Meta)); err != nil {
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

func (e *Evaluator) evalRun(ctx context.Context, runID string, running bool, cfg detect.Config) error {
	ranks, err := e.Store.RunRanks(ctx, runID)
	if err != nil {
		return err
	}
	byRank, err := recentSteps(ctx, e.Store, runID, ranks, max(cfg.Window, cfg.SpikeWindow+1, cfg.NonFiniteSteps))
	if err != nil {
		return err
	}
	in := detect.Rows{Steps: byRank, Running: running, Now: e.now()}
	in.Scores, in.Scored, err = scoreRanks(ctx, e.Store, runID, byRank, cfg)
	if err != nil {
		return err
	}
	in.Hangs, err = recentHangs(ctx, e.Store, runID, newestStepTime(byRank))
	if err != nil {
		return err
	}
	if running {
		in.GPUs, err = recentGPUs(ctx, e.Store, runID, cfg)
		if err != nil {
			return err
		}
	}
	in.Regression, in.Drift, err = e.trends(ctx, runID, running, cfg)
	if err != nil {
		return err
	}
	return reconcile(ctx, e.Store, runID, detect.Run(cfg, in))
}

// recentSteps reads each rank's newest n steps, newest first. The ranks
// come from the store (its rollup tables, not the steps), and each rank's
// rows from a backward scan of the steps' unique index: a bounded read
// however long the run.
func recentSteps(ctx context.Context, st *store.Store, runID string, ranks []int, n int) (map[int][]detect.StepRow, error) {
	rows, err := st.RecentSteps(ctx, runID, ranks, n)
	if err != nil {
		return nil, fmt.Errorf("alerts: %w", err)
	}
	return detect.ByRank(rows), nil
}

// recentGPUs reads each GPU's samples of the run over the last idle span
// plus a margin, before its newest sample, through the gpu_samples_run
// index.
func recentGPUs(ctx context.Context, st *store.Store, runID string, cfg detect.Config) ([]detect.GPUState, error) {
	span := time.Duration(cfg.IdleFor)*2 + time.Minute
	rows, err := st.RecentGPUActivity(ctx, runID, span, cfg.IdleUtilPct)
	if err != nil {
		return nil, fmt.Errorf("alerts: %w", err)
	}
	var out []detect.GPUState
	for _, r := range rows {
		g := detect.GPUState{Host: r.Host, GPU: r.GPU, Rank: r.Rank, Last: r.Last, IdleSince: r.First, LastUtil: r.LastUtil}
		if r.LastBusy != nil {
			g.IdleSince = *r.LastBusy
		}
		out = append(out, g)
	}
	return out, nil
}
