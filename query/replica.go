package query

import (
	"context"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// ReplicaLagHeader carries, on the answers that give replica_lag_s, the
// same figure in seconds, for clients that read headers only.
const ReplicaLagHeader = "X-DeepSeed-Replica-Lag"

// defaultReplayWait bounds how long a read on a standby waits for the
// standby to replay the rollups it just had refreshed on the primary.
const defaultReplayWait = 2 * time.Second

// backOff is how long reads stop waiting for a standby that did not
// replay a refresh within ReplayWait, and stop trying a primary that was
// unavailable.
const backOff = 10 * time.Second

// reading reports whether the handler reads from a database other than
// the one it writes to: a hot standby of it (docs/scale-out.md).
func (h *Handler) reading() bool { return h.opt.Primary != nil && h.opt.Primary != h.store }

// refreshRollups brings the rollups of runID up to date before a read
// that uses them. On a server that reads from a standby the refresh runs
// on the primary, and the read then waits, up to ReplayWait, for the
// standby to replay it; past that it reads what the standby has, which
// is as far behind as the replica lag says, and for backOff reads do not
// wait at all. A primary that cannot be reached leaves the rollups as the
// standby has them, and for backOff reads do not try it: reads go on
// while the primary is away.
//
// A read refreshes only a backlog of at most readRefreshBlocks markers,
// within readRefreshLimits: a larger one (a bulk import, ingest
// outrunning the background refresher, a block of a thousand ranks), or
// a refresh of the run already under way, is left to the background
// refresher, and the read answers from the rollups as they are rather
// than wait for it. Either way it notes, for the answer, how far behind
// the rollups are (rollup_lag.go).
func (h *Handler) refreshRollups(ctx context.Context, runID string) error {
	return h.refreshRollupsOf(ctx, []string{runID})
}

// refreshRollupsOf is refreshRollups of each of runIDs, their backlogs
// read together before and after the refreshes.
func (h *Handler) refreshRollupsOf(ctx context.Context, runIDs []string) error {
	bs, err := h.store.RollupBacklogs(ctx, runIDs)
	if err != nil {
		return err
	}
	var again []string
	for _, id := range runIDs {
		if b := bs[id]; b.Blocks > 0 && b.Blocks <= readRefreshBlocks {
			if err := h.refreshWithin(ctx, id); err != nil {
				return err
			}
			again = append(again, id)
		}
	}
	if len(again) > 0 {
		after, err := h.store.RollupBacklogs(ctx, again)
		if err != nil {
			return err
		}
		for _, id := range again {
			bs[id] = after[id]
		}
	}
	for _, id := range runIDs {
		noteBacklog(ctx, id, bs[id])
	}
	return nil
}

// refreshWithin is the refresh of refreshRollups.
func (h *Handler) refreshWithin(ctx context.Context, runID string) error {
	if !h.reading() {
		_, err := h.refreshBudgeted(ctx, h.store, runID)
		return err
	}
	now := time.Now().UnixNano()
	if now < h.primaryAwayUntil.Load() {
		return nil
	}
	n, err := h.refreshBudgeted(ctx, h.opt.Primary, runID)
	switch {
	case err != nil && store.IsUnavailable(err) && ctx.Err() == nil:
		h.primaryAwayUntil.Store(time.Now().Add(backOff).UnixNano())
		h.log.Warn("rollups not refreshed: the primary is unavailable; reading the standby's rollups as they are, without trying the primary again for a while",
			"run_id", runID, "retry_in", backOff.String(), "err", err)
		return nil
	case err != nil:
		return err
	case n == 0 || now < h.behindUntil.Load():
		return nil
	}
	lsn, err := h.opt.Primary.WALPosition(ctx)
	if err != nil {
		h.log.Warn("rollups refreshed on the primary, but its WAL position is unknown; reading the standby as it is", "run_id", runID, "err", err)
		return nil
	}
	caught, err := h.store.WaitReplayed(ctx, lsn, h.opt.ReplayWait)
	if err != nil {
		return err
	}
	if !caught {
		// A standby this far behind (paused, or replaying a backlog) is
		// not waited for again for a while: a list of runs refreshes each
		// of them, and the answers say how far behind it is.
		h.behindUntil.Store(time.Now().Add(backOff).UnixNano())
	}
	return nil
}

// replicaLag returns, for a running run read from a standby, how far the
// standby is behind its primary, and sets ReplicaLagHeader; nil elsewhere.
// The figure matters while a run runs: its newest steps may not be on
// the standby yet. A finished run's data no longer changes.
func (h *Handler) replicaLag(ctx context.Context, c echo.Context, r *store.RunRow) (*api.Float, error) {
	if !h.reading() || r.Status != api.StatusRunning {
		return nil, nil
	}
	rep, err := h.store.Replication(ctx)
	if err != nil {
		return nil, err
	}
	if !rep.Standby {
		return nil, nil
	}
	s := rep.Lag.Seconds()
	c.Response().Header().Set(ReplicaLagHeader, strconv.FormatFloat(s, 'f', 3, 64))
	return fv(s), nil
}

// refreshBudgeted refreshes runID's rollups on st, at most
// readRefreshBlocks markers, waiting at most readLockWait for another
// refresh of the run (the background refresher's, which a small backlog
// takes moments; a read right after an import then shows it) and within
// Options.RefreshBudget in all: a refresh cut short by the budget or the
// lock wait is rolled back, left to the background refresher, and is no
// error.
func (h *Handler) refreshBudgeted(ctx context.Context, st *store.Store, runID string) (int, error) {
	budget := h.opt.RefreshBudget
	rctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	lim := store.RefreshLimits{MaxBlocks: readRefreshBlocks, Timeout: budget, LockWait: readLockWait}
	if !firstLockWait(ctx) {
		lim.NoWait = true // one wait a request: a view over many runs answers at once
	}
	n, _, err := st.RefreshRollupsWithin(rctx, runID, lim)
	if err != nil && rctx.Err() != nil && ctx.Err() == nil {
		h.log.Debug("rollup refresh of a read cut short by its budget; left to the background refresher",
			"run_id", runID, "budget", budget.String())
		return n, nil
	}
	return n, err
}
