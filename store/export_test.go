package store

import "github.com/jackc/pgx/v5/pgxpool"

// SetAfterMarkersRead makes every refresh call f right after reading its
// markers, until the returned function restores the default.
func SetAfterMarkersRead(f func()) (restore func()) {
	old := afterMarkersRead
	afterMarkersRead = f
	return func() { afterMarkersRead = old }
}

// RankLockKey is the advisory lock a batch takes for a run's rank.
var RankLockKey = rankLockKey

// RunLockKey is the lock every batch of a run holds shared.
var RunLockKey = runLockKey

// SyncRollupSQL is the SQL the synchronisation rollups are held to.
var SyncRollupSQL = syncRollupRefSQL

// WideBatchLock is the lock a wide batch takes alone, exclusively, and
// every other batch shared.
var WideBatchLock = wideBatchLock

// OwnPool is the store's own connection pool.
func OwnPool(s *Store) *pgxpool.Pool { return s.pool }

// SetQueueVacuumBytes sets the size of an empty marker queue above which
// VacuumDrainedQueue vacuums it, and lets it vacuum again at once, until
// the returned function restores the default.
func SetQueueVacuumBytes(s *Store, n int64) (restore func()) {
	old := queueVacuumBytes
	queueVacuumBytes = n
	s.queueVacuumAt.Store(0)
	return func() { queueVacuumBytes = old }
}
