package storetest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// The replicated pair streams: what the primary commits the standby
// shows, a paused standby falls behind and says by how much, and it
// catches up when resumed. The standby refuses migrations by name.
func TestReplicatedPairStreams(t *testing.T) {
	ctx := context.Background()
	r := storetest.NewReplicated(t)
	primary := storetest.Open(t, r.PrimaryURL, nil)
	standby := storetest.Open(t, r.StandbyURL, nil)

	if rep, err := primary.Replication(ctx); err != nil || rep.Standby {
		t.Fatalf("primary: %+v, %v; want a primary", rep, err)
	}
	if rep, err := standby.Replication(ctx); err != nil || !rep.Standby {
		t.Fatalf("standby: %+v, %v; want a standby", rep, err)
	}
	if _, err := standby.Migrate(ctx); !errors.Is(err, store.ErrStandby) {
		t.Fatalf("Migrate on the standby: %v, want ErrStandby", err)
	}
	if _, err := storetest.Pool(t, standby).Exec(ctx, `CREATE TABLE nope (x int)`); !store.IsReadOnly(err) {
		t.Fatalf("a write on the standby: %v, want a read-only error", err)
	}

	count := func() int {
		var n int
		if err := storetest.Pool(t, standby).QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil {
			return -1
		}
		return n
	}
	insert := func() {
		if _, err := storetest.Pool(t, primary).Exec(ctx, `INSERT INTO t VALUES (1)`); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := storetest.Pool(t, primary).Exec(ctx, `CREATE TABLE t (x int)`); err != nil {
		t.Fatal(err)
	}
	insert()
	poll(t, "the first row on the standby", func() bool { return count() == 1 })

	lsn, err := primary.WALPosition(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := standby.WaitReplayed(ctx, lsn, time.Minute); err != nil || !ok {
		t.Fatalf("WaitReplayed(%s): %v, %v", lsn, ok, err)
	}

	r.PauseReplay(t)
	poll(t, "replay paused", func() bool { rep, err := standby.Replication(ctx); return err == nil && rep.Paused })
	insert()
	lsn, err = primary.WALPosition(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := standby.WaitReplayed(ctx, lsn, 50*time.Millisecond); err != nil || ok {
		t.Fatalf("WaitReplayed on a paused standby: %v, %v; want false", ok, err)
	}
	poll(t, "a lag on the paused standby", func() bool { rep, err := standby.Replication(ctx); return err == nil && rep.Lag > 0 })
	if n := count(); n != 1 {
		t.Fatalf("a paused standby shows %d rows, want 1", n)
	}
	r.ResumeReplay(t)
	poll(t, "the second row after resuming", func() bool { return count() == 2 })
	poll(t, "no lag once caught up", func() bool { rep, err := standby.Replication(ctx); return err == nil && rep.Lag == 0 && !rep.Paused })
}

func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute) // a standby replays under load
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
