package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// RefreshLimits bound one call of [Store.RefreshRollupsWithin].
type RefreshLimits struct {
	// MaxBlocks stops the refresh after about this many markers (whole
	// chunks); 0 means no limit.
	MaxBlocks int
	// Timeout bounds each statement of a chunk (statement_timeout); a
	// chunk that passes it is rolled back and left for later. 0 means
	// none.
	Timeout time.Duration
	// NoWait leaves the run alone, rather than wait, while another
	// refresh of it holds its lock: a read then answers from the rollups
	// as they are instead of waiting out a long refresh.
	NoWait bool
	// LockWait, without NoWait, bounds the wait for that lock (0: as
	// long as the statement timeout allows): a read waits briefly for a
	// refresh of the run under way, which a small run's takes moments,
	// and answers what its rollups hold when it takes longer.
	LockWait time.Duration
}

// errRefreshSkipped is a chunk left for later within its RefreshLimits.
var errRefreshSkipped = errors.New("rollup refresh left for later")

// errRefreshBusy is a chunk whose run another refresh holds the lock of.
var errRefreshBusy = errors.New("another refresh of the run holds its lock")

// refreshLockKey is the SQL of the key of the refresh lock of the run
// whose id is the expression run: every refresh of a run holds it for a
// chunk, and whatever deletes a run's rollups or markers takes it first.
func refreshLockKey(run string) string {
	return "hashtextextended('rollup:' || " + run + ", 0)"
}

// lockRefresh takes the run's refresh lock in tx (or, with lim.NoWait,
// fails with errRefreshBusy when it is taken) and sets the statement
// timeout of lim.
func lockRefresh(ctx context.Context, tx pgx.Tx, runID string, lim RefreshLimits) error {
	if lim.Timeout > 0 {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", max(lim.Timeout.Milliseconds(), 1))); err != nil {
			return fmt.Errorf("set statement timeout: %w", err)
		}
	}
	if !lim.NoWait {
		if lim.LockWait > 0 {
			if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", max(lim.LockWait.Milliseconds(), 1))); err != nil {
				return fmt.Errorf("set lock timeout: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(`+refreshLockKey("$1")+`)`, runID); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "55P03" { // lock_not_available: lock_timeout passed
				return errRefreshBusy
			}
			return fmt.Errorf("lock: %w", err)
		}
		if lim.LockWait > 0 {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = 0"); err != nil {
				return fmt.Errorf("reset lock timeout: %w", err)
			}
		}
		return nil
	}
	var got bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(`+refreshLockKey("$1")+`)`, runID).Scan(&got); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	if !got {
		return errRefreshBusy
	}
	return nil
}

// Settings of a refresh's transaction. A chunk's statements fold some
// hundred thousand raw and rollup rows at 1,024 ranks: at the default
// work_mem of 4 MB their sorts spill to disk, and their costs, estimated
// on statistics a bulk load left stale, pass jit_above_cost, so that
// statements were compiled with inlining and optimisation first (seven
// seconds of a seventeen-second statement on two cores). The statements
// run once a chunk: compiling them never pays. refreshWorkMem is per sort
// or hash of the one connection a refresh holds.
const refreshWorkMem = "64MB"

// refreshSettings applies the refresh's settings to tx.
func refreshSettings(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, "SET LOCAL jit = off"); err != nil {
		return fmt.Errorf("set jit: %w", err)
	}
	if _, err := tx.Exec(ctx, "SET LOCAL work_mem = '"+refreshWorkMem+"'"); err != nil {
		return fmt.Errorf("set work_mem: %w", err)
	}
	return nil
}

// skipped reports whether a chunk's err means it was left within its
// limits: the lock was busy, or a statement passed its statement_timeout
// (SQLSTATE 57014 while the caller's context is still live; a cancelled
// context cancels statements with the same code).
func skipped(err error) bool {
	if errors.Is(err, errRefreshBusy) {
		return true
	}
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "57014" && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// RollupBacklog is how far the rollups are behind the raw rows: the
// rank-blocks of 100 steps written since their last refresh, and when
// the oldest of them was written.
type RollupBacklog struct {
	Blocks int64
	Since  time.Time // zero when Blocks is 0
}

// Behind is how long the oldest waiting block has waited at now.
func (b RollupBacklog) Behind(now time.Time) time.Duration {
	if b.Blocks == 0 || b.Since.IsZero() {
		return 0
	}
	return max(now.Sub(b.Since), 0)
}

// RunRollupBacklog returns the backlog of runID's rollups.
func (s *Store) RunRollupBacklog(ctx context.Context, runID string) (RollupBacklog, error) {
	m, err := s.RollupBacklogs(ctx, []string{runID})
	return m[runID], err
}

// RollupBacklogs is [Store.RunRollupBacklog] of each of runIDs, in one
// statement; a run without a backlog has no entry.
func (s *Store) RollupBacklogs(ctx context.Context, runIDs []string) (map[string]RollupBacklog, error) {
	rows, err := s.pool.Query(ctx, `SELECT run_id, count(*), min(marked_at) FROM rollup_dirty WHERE run_id = ANY($1) GROUP BY run_id`, runIDs)
	if err != nil {
		return nil, fmt.Errorf("store: rollup backlog of %s: %w", runsWhat(runIDs), err)
	}
	defer rows.Close()
	out := map[string]RollupBacklog{}
	for rows.Next() {
		var id string
		var b RollupBacklog
		var since *time.Time
		if err := rows.Scan(&id, &b.Blocks, &since); err != nil {
			return nil, fmt.Errorf("store: rollup backlog of %s: %w", runsWhat(runIDs), err)
		}
		if since != nil {
			b.Since = *since
		}
		out[id] = b
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: rollup backlog of %s: %w", runsWhat(runIDs), err)
	}
	return out, nil
}

// TotalRollupBacklog returns the backlog of every run's rollups together.
func (s *Store) TotalRollupBacklog(ctx context.Context) (RollupBacklog, error) {
	var b RollupBacklog
	var since *time.Time
	if err := s.pool.QueryRow(ctx, `SELECT count(*), min(marked_at) FROM rollup_dirty`).Scan(&b.Blocks, &since); err != nil {
		return b, fmt.Errorf("store: rollup backlog: %w", err)
	}
	if since != nil {
		b.Since = *since
	}
	return b, nil
}
