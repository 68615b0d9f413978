package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrStandby says that the database is a hot standby: PostgreSQL in
// recovery, replaying the primary's write-ahead log, which answers reads
// and refuses every write (SQLSTATE 25006). Migrate returns it wrapped.
var ErrStandby = errors.New("the database is a hot standby (read-only, in recovery)")

// Replication is what a database says about its place in streaming
// replication.
type Replication struct {
	// Standby is true on a hot standby, false on a primary.
	Standby bool
	// Lag is how far the standby's data is behind the primary, on a
	// standby: zero when it has replayed everything it has received,
	// else the time since the newest transaction it replayed committed
	// on the primary. It cannot see WAL that it has not received, so a
	// standby cut off from its primary reads as caught up (readyz and
	// the primary's pg_stat_replication tell that case).
	Lag time.Duration
	// Paused is true while replay is paused (pg_wal_replay_pause()).
	Paused bool
}

// Replication reports whether the database is a standby and, if so, how
// far behind its primary it is.
func (s *Store) Replication(ctx context.Context) (Replication, error) {
	var r Replication
	var lagS float64
	// CASE, not AND: pg_is_wal_replay_paused() fails on a primary, and
	// only CASE fixes the order in which PostgreSQL evaluates.
	err := s.pool.QueryRow(ctx, `
		SELECT pg_is_in_recovery(),
		       CASE WHEN NOT pg_is_in_recovery() THEN 0
		            WHEN pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn() THEN 0
		            ELSE greatest(0, extract(epoch FROM now() - pg_last_xact_replay_timestamp()))
		       END::float8,
		       CASE WHEN pg_is_in_recovery() THEN pg_is_wal_replay_paused() ELSE false END`).Scan(&r.Standby, &lagS, &r.Paused)
	if err != nil {
		return Replication{}, fmt.Errorf("store: read replication state: %w", err)
	}
	r.Lag = time.Duration(lagS * float64(time.Second))
	return r, nil
}

// WALPosition returns the primary's current write-ahead log position, as
// PostgreSQL writes an LSN ("0/3000148"), for WaitReplayed on a standby:
// the insert position, which covers every transaction committed so far,
// even one whose commit record is not yet flushed (synchronous_commit
// off).
func (s *Store) WALPosition(ctx context.Context) (string, error) {
	var lsn string
	if err := s.pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn); err != nil {
		return "", fmt.Errorf("store: read WAL position: %w", err)
	}
	return lsn, nil
}

// WaitReplayed waits, polling, until the standby has replayed the primary's
// log up to lsn or within has passed, and reports whether it got there. On
// a primary it returns true at once.
func (s *Store) WaitReplayed(ctx context.Context, lsn string, within time.Duration) (bool, error) {
	deadline := time.Now().Add(within)
	wait := 2 * time.Millisecond
	for {
		var done bool
		err := s.pool.QueryRow(ctx, `SELECT NOT pg_is_in_recovery() OR pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&done)
		if err != nil {
			return false, fmt.Errorf("store: read replay position: %w", err)
		}
		if done {
			return true, nil
		}
		if time.Now().Add(wait).After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("store: wait for replay: %w", ctx.Err())
		case <-time.After(wait):
		}
		wait = min(wait*2, 100*time.Millisecond)
	}
}
