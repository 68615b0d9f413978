package store

import (
	"context"
	"fmt"
	"time"
)

// WithImportLock runs fn holding the import lock of run runID: a
// session-level advisory lock on a connection of its own, so that every
// server of a database sees it. Imports of one run take it around their
// check of where the run is stored and their write, which makes the two
// one decision: of imports racing into different projects, the first
// stores the run and the others find it there. Batches do not take it.
//
// A waiting import holds no connection: it tries the lock every
// importLockPoll, so that imports queued on one run cannot take the
// connections the one holding it needs for its write.
func (s *Store) WithImportLock(ctx context.Context, runID string, fn func() error) error {
	key := lockKey(runID, "import")
	for {
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("store: lock run %s for import: %w", runID, err)
		}
		var got bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&got); err != nil {
			conn.Release()
			return fmt.Errorf("store: lock run %s for import: %w", runID, err)
		}
		if got {
			defer conn.Release()
			defer func() {
				// Unlocked even when ctx is done; a connection that cannot
				// unlock is closed, which frees the lock with its session.
				if _, err := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, key); err != nil {
					conn.Conn().Close(context.WithoutCancel(ctx))
				}
			}()
			return fn()
		}
		conn.Release()
		select {
		case <-ctx.Done():
			return fmt.Errorf("store: lock run %s for import: %w", runID, ctx.Err())
		case <-time.After(importLockPoll):
		}
	}
}

// importLockPoll is how often a waiting import tries the lock again.
const importLockPoll = 20 * time.Millisecond
