package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// TestDrainedQueueIsCutBack: the markers a load leaves behind once the
// refresher has taken them all no longer hold the queue's file at its
// largest; a queue that still holds a marker is left alone.
func TestDrainedQueueIsCutBack(t *testing.T) {
	s := storetest.NewStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer store.SetQueueVacuumBytes(s, 64<<10)()
	pool := storetest.Pool(t, s)
	size := func() int64 {
		t.Helper()
		var n int64
		if err := pool.QueryRow(ctx, `SELECT pg_relation_size('rollup_dirty')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	mark := func() {
		t.Helper()
		mustExec(t, s, `INSERT INTO rollup_dirty (run_id, rank, block)
			SELECT 'q', r, b FROM generate_series(0, 99) r, generate_series(0, 199) b`)
	}
	mark()
	// One marker left: the queue is not drained and keeps its file.
	mustExec(t, s, `DELETE FROM rollup_dirty WHERE NOT (rank = 7 AND block = 7)`)
	full := size()
	if before, _, err := s.VacuumDrainedQueue(ctx); err != nil || before != 0 {
		t.Fatalf("vacuumed a queue holding a marker: %d bytes before, %v", before, err)
	}
	if size() != full {
		t.Fatalf("queue holding a marker went from %d to %d bytes", full, size())
	}
	// The last one taken: the file is cut back.
	mustExec(t, s, `DELETE FROM rollup_dirty`)
	before, after, err := s.VacuumDrainedQueue(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if before != full || after > full/10 || size() != after {
		t.Fatalf("drained queue of %d bytes: vacuum saw %d, left %d (now %d)", full, before, after, size())
	}
	// Markers come again and work as before.
	mark()
	if n := mustCount(t, s, `SELECT count(*) FROM rollup_dirty`); n != 20000 {
		t.Fatalf("%d markers after the vacuum, want 20000", n)
	}
}
