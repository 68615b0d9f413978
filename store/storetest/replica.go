package storetest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/deepseed/deepseed/internal/localpg"
)

// Replicated is a primary PostgreSQL and a hot standby streaming from it,
// both started from the machine's binaries for one test: the topology of
// a query server reading from a replica (docs/scale-out.md).
type Replicated struct {
	// PrimaryURL and StandbyURL name the same database, "deepseed",
	// empty and not yet migrated, on the primary and on the standby.
	PrimaryURL, StandbyURL string

	standbyAdmin string
	primary      *localpg.Cluster
}

// NewReplicated starts a primary and a streaming replica of it made with
// pg_basebackup -R, on free loopback ports, in a temporary directory; both
// stop and are removed when the test ends. It does so even when
// DEEPSEED_TEST_DATABASE_URL names a server, since replication needs
// clusters of its own. DEEPSEED_TEST_TIMESCALE=off keeps TimescaleDB out
// of both.
func NewReplicated(t testing.TB) *Replicated {
	t.Helper()
	dir := DataDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	off := os.Getenv(timescaleEnv) == "off"
	settings := map[string]string{"timescaledb.max_background_workers": "0"}
	primary := &localpg.Cluster{Dir: filepath.Join(dir, "primary"), WithoutTimescale: off, Settings: settings}
	admin, err := primary.Start(ctx)
	if err != nil {
		t.Fatalf("storetest: start primary: %v", err)
	}
	t.Cleanup(func() {
		if err := primary.Stop(); err != nil {
			t.Errorf("storetest: stop primary: %v", err)
		}
	})
	mustExec(t, ctx, admin, `CREATE DATABASE deepseed`)
	standby := &localpg.Cluster{Dir: filepath.Join(dir, "standby")}
	sadmin, err := primary.StartStandby(ctx, standby)
	if err != nil {
		t.Fatalf("storetest: start standby: %v", err)
	}
	// Registered last, so it runs first: the standby stops before its
	// primary and never waits for it to come back.
	t.Cleanup(func() {
		if err := standby.Stop(); err != nil {
			t.Errorf("storetest: stop standby: %v", err)
		}
	})
	r := &Replicated{
		PrimaryURL: WithDatabase(admin, "deepseed"), StandbyURL: WithDatabase(sadmin, "deepseed"),
		standbyAdmin: sadmin, primary: primary,
	}
	// The standby answers once it has reached a consistent state, which
	// on a loaded machine takes a while.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		err := execSQL(ctx, r.StandbyURL, `SELECT 1`)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("storetest: the standby never answered: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return r
}

// PauseReplay stops the standby from applying what it receives
// (pg_wal_replay_pause()): its data stays as it is and falls behind.
func (r *Replicated) PauseReplay(t testing.TB) {
	t.Helper()
	r.standbyExec(t, `SELECT pg_wal_replay_pause()`)
}

// ResumeReplay lets the standby catch up again (pg_wal_replay_resume()).
func (r *Replicated) ResumeReplay(t testing.TB) {
	t.Helper()
	r.standbyExec(t, `SELECT pg_wal_replay_resume()`)
}

// StopPrimary stops the primary (fast shutdown); the standby stays up,
// read-only, trying to reconnect.
func (r *Replicated) StopPrimary(t testing.TB) {
	t.Helper()
	if err := r.primary.Stop(); err != nil {
		t.Fatalf("storetest: stop primary: %v", err)
	}
}

func (r *Replicated) standbyExec(t testing.TB, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mustExec(t, ctx, r.standbyAdmin, sql)
}
