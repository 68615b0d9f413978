package store_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

// needTimescale skips the test or benchmark where the tests run on plain
// PostgreSQL.
func needTimescale(t testing.TB) {
	t.Helper()
	if !storetest.Mode(t).Timescale {
		t.Skip("needs TimescaleDB: this machine's PostgreSQL has no timescaledb extension (the suite runs on plain PostgreSQL)")
	}
}

// Two servers starting at once must apply each migration exactly once.
func TestMigrateConcurrently(t *testing.T) {
	ctx := context.Background()
	s := storetest.NewStore(t)
	// The template is already migrated: drop the record to force a rerun race.
	if _, err := storetest.Pool(t, s).Exec(ctx, `DROP SCHEMA public CASCADE; CREATE SCHEMA public`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	applied := make([][]string, 4)
	for i := range errs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			applied[i], errs[i] = s.Migrate(ctx)
		}(i)
	}
	wg.Wait()
	total := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrate %d: %v", i, err)
		}
		total += len(applied[i])
	}
	ms, _ := store.Migrations()
	if total != len(ms) {
		t.Fatalf("applied %d migrations across 4 concurrent runs, want %d exactly once each", total, len(ms))
	}
	ok, err := s.Migrated(ctx)
	if err != nil || !ok {
		t.Fatalf("Migrated = %v, %v", ok, err)
	}
}

// Every pooled connection ended at once by the database (an administrator,
// a restart) is not a database that is away: Migrated goes on to a live
// connection and answers.
func TestMigratedAfterEveryPooledConnectionEnded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := storetest.NewDatabase(t)
	s := storetest.Open(t, url, nil)
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Six connections in the store's pool, idle.
	pool := store.OwnPool(s)
	var conns []*pgxpool.Conn
	for i := 0; i < 6; i++ {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	var name string
	if err := conns[0].QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		c.Release()
	}
	admin, err := pgx.Connect(ctx, storetest.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var ended int
	if err := admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`,
		name).Scan(&ended); err != nil || ended < 6 {
		t.Fatalf("ended %d connections (%v), want 6 or more", ended, err)
	}
	// The ended backends are gone before the pool uses their connections.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var left int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`,
			name).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends still there a minute after they were ended", left)
		}
	}
	ok, err := s.Migrated(ctx)
	if err != nil || !ok {
		t.Fatalf("Migrated after the pooled connections ended: %v, %v; want true", ok, err)
	}
}
