package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// holdInTx opens a transaction on its own connection, runs sql in it and
// keeps it open until the test ends or release is called.
func holdInTx(t *testing.T, s *store.Store, sql string, args ...any) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := storetest.Pool(t, s).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			tx.Rollback(ctx)
			conn.Release()
		})
	}
	t.Cleanup(release)
	return release
}

func stepLine(run string, rank, step int, at int) string {
	return fmt.Sprintf(`{"kind":"step","run_id":%q,"rank":%d,"step":%d,"time":%d,"loss":%d.5}`, run, rank, step, at, step)
}

// writeWaitsForLock writes recs in the background and returns once the
// write waits for an advisory lock, as the database shows, without having
// written; what names the write in failures. The channel gives its error.
func writeWaitsForLock(t *testing.T, s *store.Store, what string, recs []api.Record) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := s.WriteBatch(context.Background(), recs)
		done <- err
	}()
	for deadline := time.Now().Add(2 * time.Minute); mustCount(t, s, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) == 0; time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("%s ended while the lock it needs was held elsewhere (err %v)", what, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never waited for its lock", what)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("%s ended while the lock it needs was held elsewhere (err %v)", what, err)
	default:
	}
	return done
}

// writeEnds waits, within limit, for the write of writeWaitsForLock once
// its lock is let go, and fails the test on its error.
func writeEnds(t *testing.T, done <-chan error, what string, limit time.Duration) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(limit):
		t.Fatalf("%s still waits after the lock was let go", what)
	}
}

// A rank's batch does not wait for another rank of the same run, nor for
// the runs row, while a batch of the same rank does wait.
func TestWriteBatchRanksDoNotWaitForEachOther(t *testing.T) {
	s := storetest.NewStore(t)
	mustWrite(t, s, stepLine("par", 0, 0, 1000), stepLine("par", 1, 0, 1000))

	// Rank 0's lock is held by a transaction that stays open, and so is
	// the run's row.
	releaseRank := holdInTx(t, s, `SELECT pg_advisory_xact_lock($1)`, store.RankLockKey("par", 0))
	holdInTx(t, s, `SELECT 1 FROM runs WHERE run_id = 'par' FOR UPDATE`)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.WriteBatch(ctx, mustDecode(t, stepLine("par", 1, 1, 1000), stepLine("par", 1, 2, 1000)))
	if err != nil {
		t.Fatalf("rank 1 waited for rank 0's lock or the runs row: %v", err)
	}
	wantResult(t, res, 2, 0)

	// Rank 0 itself waits until the lock is let go.
	done := writeWaitsForLock(t, s, "rank 0's write", mustDecode(t, stepLine("par", 0, 1, 1000)))
	releaseRank()
	writeEnds(t, done, "rank 0's write", 30*time.Second)
	if n := mustCount(t, s, `SELECT count(*) FROM steps WHERE run_id = 'par'`); n != 5 {
		t.Fatalf("%d steps stored, want 5", n)
	}
}

// Many ranks of one run write, retry and resume at once: every key is
// stored once, with its newest values.
func TestWriteBatchManyRanksConcurrently(t *testing.T) {
	s := storetest.NewStore(t)
	const ranks, batches, per = 8, 10, 10
	var wg sync.WaitGroup
	for r := 0; r < ranks; r++ {
		for copy := 0; copy < 2; copy++ { // each batch is also sent again at once
			wg.Add(1)
			go func() {
				defer wg.Done()
				for b := 0; b < batches; b++ {
					var lines []string
					for i := 0; i < per; i++ {
						step := b*per + i
						lines = append(lines, stepLine("many", r, step, 1000+step),
							fmt.Sprintf(`{"kind":"layers","run_id":"many","rank":%d,"step":%d,"time":%d,"names":["emb","enc","head"],"forward_ms":[1,2,3]}`, r, step, 1000+step))
					}
					if _, err := s.WriteBatch(context.Background(), mustDecode(t, lines...)); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	// A resumed rank 3 redoes steps 50..59 later: the newer values win.
	var lines []string
	for step := 50; step < 60; step++ {
		lines = append(lines, fmt.Sprintf(`{"kind":"step","run_id":"many","rank":3,"step":%d,"time":%d,"loss":-1}`, step, 5000+step))
	}
	mustWrite(t, s, lines...)

	if n := mustCount(t, s, `SELECT count(*) FROM steps WHERE run_id = 'many'`); n != ranks*batches*per {
		t.Fatalf("%d steps, want %d", n, ranks*batches*per)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM layer_times WHERE run_id = 'many'`); n != ranks*batches*per {
		t.Fatalf("%d layer rows, want %d", n, ranks*batches*per)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM (SELECT 1 FROM steps WHERE run_id = 'many' GROUP BY rank, step HAVING count(*) > 1) d`); n != 0 {
		t.Fatalf("%d duplicated steps", n)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM steps WHERE run_id = 'many' AND rank = 3 AND step BETWEEN 50 AND 59 AND loss = -1`); n != 10 {
		t.Fatalf("%d of the 10 resumed steps show the newer values", n)
	}
	var last time.Time
	if err := storetest.Pool(t, s).QueryRow(context.Background(), `SELECT last_seen_at FROM runs WHERE run_id = 'many'`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if want := time.Unix(5059, 0); !last.Equal(want) {
		t.Fatalf("last_seen_at = %v, want %v", last.UTC(), want.UTC())
	}
}

// Ranks that bring layer names the run has not seen, at the same time,
// each get their names added once and their times at their names.
func TestWriteBatchLayerNamesGrowUnderRace(t *testing.T) {
	s := storetest.NewStore(t)
	const ranks = 6
	var wg sync.WaitGroup
	for r := 0; r < ranks; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			line := fmt.Sprintf(`{"kind":"layers","run_id":"grow","rank":%d,"step":1,"time":1000,"names":["emb","only%d"],"forward_ms":[1,%d]}`, r, r, 100+r)
			if _, err := s.WriteBatch(context.Background(), mustDecode(t, line)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	var names []string
	if err := storetest.Pool(t, s).QueryRow(context.Background(), `SELECT layer_names FROM runs WHERE run_id = 'grow'`).Scan(&names); err != nil {
		t.Fatal(err)
	}
	if len(names) != ranks+1 || strings.Count(strings.Join(names, ","), "emb") != 1 {
		t.Fatalf("layer names %v: want emb and one name per rank, each once", names)
	}
	pos := map[string]int{}
	for i, n := range names {
		pos[n] = i
	}
	rows, err := storetest.Pool(t, s).Query(context.Background(), `SELECT rank, forward_ms FROM layer_times WHERE run_id = 'grow'`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct {
		rank int32
		fwd  []*float64
	}, error) {
		var v struct {
			rank int32
			fwd  []*float64
		}
		err := row.Scan(&v.rank, &v.fwd)
		return v, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != ranks {
		t.Fatalf("%d layer rows, want %d", len(got), ranks)
	}
	for _, v := range got {
		own := pos[fmt.Sprintf("only%d", v.rank)]
		if v.fwd[pos["emb"]] == nil || *v.fwd[pos["emb"]] != 1 || own >= len(v.fwd) || v.fwd[own] == nil || *v.fwd[own] != float64(100+v.rank) {
			t.Fatalf("rank %d: forward %v does not match names %v", v.rank, v.fwd, names)
		}
	}
}

// An event sent without a time is stored once however often it is sent;
// the server stamps it, so its content is its key.
func TestWriteBatchUntimedEventsDedupe(t *testing.T) {
	s := storetest.NewStore(t)
	ev := `{"kind":"event","run_id":"ev","step":7,"rank":0,"type":"checkpoint","text":"saved ckpt-7"}`
	for i := 0; i < 4; i++ {
		res := mustWrite(t, s, ev)
		if i == 0 {
			wantResult(t, res, 1, 0)
		} else {
			wantResult(t, res, 0, 1)
		}
	}
	// Twice in one batch, and another text: one more row.
	mustWrite(t, s, ev, ev, `{"kind":"event","run_id":"ev","step":7,"rank":0,"type":"checkpoint","text":"saved ckpt-7b"}`)
	if n := mustCount(t, s, `SELECT count(*) FROM events WHERE run_id = 'ev'`); n != 2 {
		t.Fatalf("%d events stored, want 2", n)
	}
	// Timed events keep their own key: the same text at two times is two events.
	mustWrite(t, s, `{"kind":"event","run_id":"ev","time":1000,"type":"note","text":"x"}`,
		`{"kind":"event","run_id":"ev","time":1001,"type":"note","text":"x"}`,
		`{"kind":"event","run_id":"ev","time":1001,"type":"note","text":"x"}`)
	if n := mustCount(t, s, `SELECT count(*) FROM events WHERE run_id = 'ev' AND type = 'note'`); n != 2 {
		t.Fatalf("%d timed notes stored, want 2", n)
	}
}

// WriteBatchNew writes a batch of new keys and refuses, changing nothing,
// one that repeats a stored key, and records it cannot count.
func TestWriteBatchNew(t *testing.T) {
	s := storetest.NewStore(t)
	ctx := context.Background()
	batch := mustDecode(t, `{"kind":"run","run_id":"nw","project":"p"}`, stepLine("nw", 0, 1, 1000), stepLine("nw", 1, 1, 1000),
		`{"kind":"layers","run_id":"nw","rank":0,"step":1,"time":1000,"names":["a"],"forward_ms":[1]}`,
		`{"kind":"eval","run_id":"nw","step":1,"time":1000,"loss":1}`)
	res, err := s.WriteBatchNew(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	wantResult(t, res, 5, 0)
	before := tableCounts(t, s)
	// A retry of the same steps, with a new one beside them.
	_, err = s.WriteBatchNew(ctx, mustDecode(t, stepLine("nw", 0, 1, 1000), stepLine("nw", 0, 2, 1000)))
	if !errors.Is(err, store.ErrNotDirect) {
		t.Fatalf("retried batch: err %v, want ErrNotDirect", err)
	}
	if after := tableCounts(t, s); after != before {
		t.Fatalf("a refused batch changed the tables: %s, then %s", before, after)
	}
	if _, err := s.WriteBatchNew(ctx, mustDecode(t, `{"kind":"event","run_id":"nw","type":"note","time":1000}`)); err == nil {
		t.Fatal("an event was taken by WriteBatchNew")
	}
}
