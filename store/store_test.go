package store_test

import (
	"context"
	"os"
	"sync"
	"testing"

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
