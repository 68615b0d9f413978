// Package alerts runs the server's detectors: rules over the rows a run
// has already stored (steps, hang events, GPU samples) that open an alert
// when a training run goes wrong — a non-finite loss, an overflow storm, a
// loss spike, an idle GPU, a stalled run or rank, a starving input
// pipeline, a straggling rank, a hang — keep it single while the condition
// holds and resolve it when it clears. The detectors themselves are pure
// functions in package detect, listed in detect.Table; this package reads
// their rows, stores the straggler scores, keeps the alerts table and
// shows it on /metrics.
//
// The detectors run in a background evaluator (Run), never in the ingest
// path: every few seconds one server (an advisory lock elects it) reads
// the newest rows of each running run, a bounded amount per run, runs
// every detector of the table over them and reconciles the alerts table
// with what fires.
package alerts

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/alerts/detect"
	"github.com/deepseed/deepseed/internal/tick"
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
	Config detect.Config
	Log    *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Run evaluates every interval until ctx is done. Several servers may run
// it: a pass runs only on the one holding the advisory lock.
func (e *Evaluator) Run(ctx context.Context, every time.Duration) {
	log := e.logger()
	tick.Loop(ctx, every, false, func(ctx context.Context) bool {
		if _, err := e.Pass(ctx); err != nil && ctx.Err() == nil {
			log.Warn("evaluate detectors", "err", err)
		}
		return false
	})
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
	conn, err := e.Store.Pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("alerts: acquire connection: %w", err)
	}
	defer conn.Release()
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, lockKey).Scan(&got); err != nil {
		return false, fmt.Errorf("alerts: take lock: %w", err)
	}
	if !got {
		return false, nil
	}
	defer func() {
		// A fresh context: the pass's may be done, the lock must go.
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, lockKey); err != nil {
			conn.Conn().Close(uctx) // closing the session drops the lock
		}
	}()

	rows, err := conn.Query(ctx, `SELECT run_id, status = 'running', meta FROM runs
		WHERE (status = 'running' AND last_seen_at > now() - interval '1 day')
		   OR run_id IN (SELECT run_id FROM alerts WHERE resolved_at IS NULL)
		ORDER BY last_seen_at DESC NULLS LAST LIMIT $1`, maxRuns)
	if err != nil {
		return true, fmt.Errorf("alerts: list runs: %w", err)
	}
	type cand struct {
		id      string
		running bool
		meta    []byte
	}
	runs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (cand, error) {
		var c cand
		err := r.Scan(&c.id, &c.running, &c.meta)
		return c, err
	})
	if err != nil {
		return true, fmt.Errorf("alerts: list runs: %w", err)
	}
	for _, r := range runs {
		if ctx.Err() != nil {
			return true, ctx.Err()
		}
		if err := e.evalRun(ctx, conn, r.id, r.running, e.Config.WithMeta(r.meta)); err != nil {
			e.logger().Warn("evaluate run", "run_id", r.id, "err", err)
		}
	}
	return true, nil
}

// querier is what evalRun needs of a connection.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

func (e *Evaluator) evalRun(ctx context.Context, q querier, runID string, running bool, cfg detect.Config) error {
	ranks, err := e.Store.RunRanks(ctx, runID)
	if err != nil {
		return err
	}
	byRank, err := recentSteps(ctx, q, runID, ranks, max(cfg.Window, cfg.SpikeWindow+1, cfg.NonFiniteSteps))
	if err != nil {
		return err
	}
	in := detect.Rows{Steps: byRank, Running: running, Now: e.now()}
	in.Scores, in.Scored, err = scoreRanks(ctx, q, runID, byRank, cfg)
	if err != nil {
		return err
	}
	in.Hangs, err = recentHangs(ctx, q, runID, newestStepTime(byRank))
	if err != nil {
		return err
	}
	if running {
		in.GPUs, err = recentGPUs(ctx, q, runID, cfg)
		if err != nil {
			return err
		}
	}
	return reconcile(ctx, q, runID, detect.Run(cfg, in))
}

// recentSteps reads each rank's newest n steps, newest first. The ranks
// come from the store (its rollup tables, not the steps), and each rank's
// rows from a backward scan of the steps' unique index: a bounded read
// however long the run.
func recentSteps(ctx context.Context, q querier, runID string, ranks []int, n int) (map[int][]detect.StepRow, error) {
	rk := make([]int32, len(ranks))
	for i, r := range ranks {
		rk[i] = int32(r)
	}
	rows, err := q.Query(ctx, `
		SELECT rk.rank, x.step, x.time, x.loss, x.grad_norm, x.loss_scale, coalesce(x.skipped, false), x.step_ms, x.data_ms,
			x.sync_ns, x.sync_wait_ms
		FROM unnest($3::int[]) AS rk(rank), LATERAL (SELECT step, time, loss, grad_norm, loss_scale, skipped, step_ms, data_ms, sync_ns, sync_wait_ms FROM steps
			WHERE run_id = $1 AND rank = rk.rank ORDER BY step DESC, time DESC LIMIT $2) x
		ORDER BY rk.rank, x.step DESC`, runID, n, rk)
	if err != nil {
		return nil, fmt.Errorf("alerts: recent steps of %s: %w", runID, err)
	}
	defer rows.Close()
	out := map[int][]detect.StepRow{}
	for rows.Next() {
		var s detect.StepRow
		if err := rows.Scan(&s.Rank, &s.Step, &s.Time, &s.Loss, &s.GradNorm, &s.LossScale, &s.Skipped, &s.StepMS, &s.DataMS, &s.SyncNS, &s.SyncWaitMS); err != nil {
			return nil, fmt.Errorf("alerts: recent steps of %s: %w", runID, err)
		}
		out[s.Rank] = append(out[s.Rank], s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("alerts: recent steps of %s: %w", runID, err)
	}
	return out, nil
}

// recentGPUs reads each GPU's samples of the run over the last idle span
// plus a margin, before its newest sample, through the gpu_samples_run
// index.
func recentGPUs(ctx context.Context, q querier, runID string, cfg detect.Config) ([]detect.GPUState, error) {
	span := time.Duration(cfg.IdleFor)*2 + time.Minute
	rows, err := q.Query(ctx, `WITH last AS (SELECT max(time) AS t FROM gpu_samples WHERE run_id = $1 AND run_id <> '')
		SELECT host, gpu, max(rank), max(time), max(time) FILTER (WHERE util_pct >= $3), min(time),
			(array_agg(util_pct ORDER BY time DESC))[1]
		FROM gpu_samples, last
		WHERE run_id = $1 AND run_id <> '' AND time > last.t - make_interval(secs => $2) AND util_pct IS NOT NULL
		GROUP BY host, gpu ORDER BY host, gpu`, runID, span.Seconds(), cfg.IdleUtilPct)
	if err != nil {
		return nil, fmt.Errorf("alerts: recent GPU samples of %s: %w", runID, err)
	}
	defer rows.Close()
	var out []detect.GPUState
	for rows.Next() {
		var g detect.GPUState
		var busy *time.Time
		var first time.Time
		if err := rows.Scan(&g.Host, &g.GPU, &g.Rank, &g.Last, &busy, &first, &g.LastUtil); err != nil {
			return nil, fmt.Errorf("alerts: recent GPU samples of %s: %w", runID, err)
		}
		g.IdleSince = first
		if busy != nil {
			g.IdleSince = *busy
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("alerts: recent GPU samples of %s: %w", runID, err)
	}
	return out, nil
}
