package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// A batch of 50,000 ranks (what --max-batch-rows lets one body hold) is
// stored: it does not take a lock per rank, which would fill PostgreSQL's
// lock table and fail on every retry.
func TestWriteBatchOfFiftyThousandRanks(t *testing.T) {
	s := storetest.NewStore(t)
	const ranks = 50000
	lines := make([]string, 0, ranks+8)
	for r := 0; r < ranks; r++ {
		lines = append(lines, stepLine(fmt.Sprintf("wide-%d", r%4), r, 0, 1000))
	}
	for h := 0; h < 8; h++ {
		lines = append(lines, fmt.Sprintf(`{"kind":"gpu","host":"node-%d","gpu":0,"time":1000,"util_pct":50}`, h))
	}
	res := mustWrite(t, s, lines...)
	wantResult(t, res, ranks+8, 0)
	if n := mustCount(t, s, `SELECT count(*) FROM steps WHERE run_id LIKE 'wide-%'`); n != ranks {
		t.Fatalf("%d steps stored, want %d", n, ranks)
	}
	// Sent again, every record is a duplicate. (On TimescaleDB the probe
	// for stored rows once joined by a nested loop: 50,000 ranks took
	// minutes and ran out of the write's time, for ever.)
	res = mustWrite(t, s, lines...)
	wantResult(t, res, 0, ranks+8)
}

// A wide batch waits for a batch in flight, which holds the wide-batch
// lock shared, and writes once it is done.
func TestWideBatchWaitsForBatchesInFlight(t *testing.T) {
	s := storetest.NewStore(t)
	// A batch of rank 5 in flight: the wide-batch lock shared, then its
	// rank's lock.
	release := holdInTx(t, s, `SELECT pg_advisory_xact_lock_shared($1), pg_advisory_xact_lock($2)`,
		store.WideBatchLock, store.RankLockKey("wide", 5))
	var lines []string
	for r := 0; r <= store.MaxBatchLocks; r++ {
		lines = append(lines, stepLine("wide", r, 0, 1000))
	}
	done := writeWaitsForLock(t, s, "the wide batch", mustDecode(t, lines...))
	if n := mustCount(t, s, `SELECT count(*) FROM steps WHERE run_id = 'wide'`); n != 0 {
		t.Fatalf("%d steps stored while the batch in flight held its locks", n)
	}
	release()
	writeEnds(t, done, "the wide batch", time.Minute)
	if n := mustCount(t, s, `SELECT count(*) FROM steps WHERE run_id = 'wide'`); n != store.MaxBatchLocks+1 {
		t.Fatalf("%d steps stored, want %d", n, store.MaxBatchLocks+1)
	}
}

// Wide batches and a rank's own batches of the same steps race: every
// step is stored once and counted once, as accepted or as a duplicate.
func TestWideAndNarrowBatchesOfTheSameSteps(t *testing.T) {
	s := storetest.NewStore(t)
	ranks := store.MaxBatchLocks + 44
	const rounds = 6
	var wg sync.WaitGroup
	var mu sync.Mutex
	accepted, dups := 0, 0
	add := func(res store.WriteResult) {
		mu.Lock()
		accepted += res.Accepted
		dups += res.Duplicates
		mu.Unlock()
	}
	for w := 0; w < 2; w++ { // two wide writers, each every rank of a round
		wg.Add(1)
		go func() {
			defer wg.Done()
			for step := 0; step < rounds; step++ {
				var lines []string
				for r := 0; r < ranks; r++ {
					lines = append(lines, stepLine("race", r, step, 1000+step))
				}
				res, err := s.WriteBatch(context.Background(), mustDecode(t, lines...))
				if err != nil {
					t.Error(err)
					return
				}
				add(res)
			}
		}()
	}
	for r := 0; r < 8; r++ { // and eight ranks on their own
		wg.Add(1)
		go func() {
			defer wg.Done()
			for step := 0; step < rounds; step++ {
				res, err := s.WriteBatch(context.Background(), mustDecode(t, stepLine("race", r, step, 1000+step)))
				if err != nil {
					t.Error(err)
					return
				}
				add(res)
			}
		}()
	}
	wg.Wait()
	want := ranks * rounds
	if n := mustCount(t, s, `SELECT count(*) FROM steps WHERE run_id = 'race'`); n != want {
		t.Fatalf("%d steps stored, want %d", n, want)
	}
	if accepted != want || dups != ranks*rounds+8*rounds {
		t.Fatalf("accepted %d and %d duplicates, want %d and %d", accepted, dups, want, ranks*rounds+8*rounds)
	}
}
