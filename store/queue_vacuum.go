package store

import (
	"context"
	"fmt"
	"time"
)

// The rollup markers' file after a load. Every batch marks the blocks it
// wrote in rollup_dirty and the refresher deletes the markers it took, so
// a load leaves dead markers behind at the rate it writes: a 1,024-rank
// load of 2,000 steps left 48 MB of them in an empty queue, more than the
// layer rollups of the whole run. Autovacuum frees them for reuse, but the
// file keeps its size unless a vacuum finds its last pages empty and can
// take the table's lock for a moment, which ingest's inserts rarely leave
// it. The refresher therefore vacuums the queue itself once it has
// drained it: with no live marker every page is empty and the file is cut
// back to nothing.

// queueVacuumBytes is the size of an empty queue's file above which the
// refresher vacuums it, at most every queueVacuumEvery.
var queueVacuumBytes int64 = 8 << 20

const queueVacuumEvery = time.Minute

// VacuumDrainedQueue vacuums rollup_dirty when it holds no marker and its
// file has grown past queueVacuumBytes, at most every queueVacuumEvery;
// it returns the bytes the file had and has after, zero when it did not
// vacuum. A marker written meanwhile only keeps its own page.
func (s *Store) VacuumDrainedQueue(ctx context.Context) (before, after int64, err error) {
	now := time.Now().UnixNano()
	if last := s.queueVacuumAt.Load(); last != 0 && now-last < int64(queueVacuumEvery) {
		return 0, 0, nil
	}
	var empty bool
	if err := s.pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM rollup_dirty), pg_relation_size('rollup_dirty')`).Scan(&empty, &before); err != nil {
		return 0, 0, fmt.Errorf("store: size of the rollup queue: %w", err)
	}
	if !empty || before <= queueVacuumBytes {
		return 0, 0, nil
	}
	s.queueVacuumAt.Store(now)
	start := time.Now()
	if _, err := s.pool.Exec(ctx, `VACUUM rollup_dirty`); err != nil {
		return 0, 0, fmt.Errorf("store: vacuum the rollup queue: %w", err)
	}
	if err := s.pool.QueryRow(ctx, `SELECT pg_relation_size('rollup_dirty')`).Scan(&after); err != nil {
		return 0, 0, fmt.Errorf("store: size of the rollup queue: %w", err)
	}
	s.log.Info("vacuumed the drained rollup queue", "bytes_before", before, "bytes_after", after, "took", time.Since(start))
	return before, after, nil
}
