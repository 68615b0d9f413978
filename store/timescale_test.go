package store_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/internal/localpg"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// Without the timescaledb extension SetupTimescale reports plain mode,
// changes nothing, and can run again at every start.
func TestSetupTimescalePlainPostgres(t *testing.T) {
	ctx := context.Background()
	s := storetest.NewStore(t)
	var available bool
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'timescaledb')`).Scan(&available); err != nil {
		t.Fatal(err)
	}
	if available {
		t.Skip("timescaledb is installed on this server: the plain path cannot be observed here")
	}
	for range 2 {
		on, version, err := s.SetupTimescale(ctx, store.TimescaleOptions{CompressAfter: 7 * 24 * time.Hour})
		if err != nil || on || version != "" {
			t.Fatalf("SetupTimescale = %v, %q, %v; want false, \"\", nil", on, version, err)
		}
	}
	if s.Timescale {
		t.Fatal("Store.Timescale is true on plain PostgreSQL")
	}
	var n int
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT count(*) FROM pg_extension WHERE extname = 'timescaledb'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("timescaledb extension rows = %d, %v; want 0", n, err)
	}
	// The tables are still plain and writable.
	if _, err := storetest.Pool(t, s).Exec(ctx, `INSERT INTO host_samples (time, host, cpu_util_pct) VALUES (now(), 'h1', 12.5)`); err != nil {
		t.Fatalf("write after setup: %v", err)
	}
}

// An unreachable database is an error, not a silent plain mode.
func TestSetupTimescaleUnreachable(t *testing.T) {
	s, err := store.Open(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := s.SetupTimescale(ctx, store.TimescaleOptions{}); err == nil {
		t.Fatal("SetupTimescale on an unreachable database returned nil error")
	}
}

// serve and migrate share one rule (SetupMode): where TimescaleDB is not
// installed, or installed but not preloaded, the database runs plain and
// the mode says why and how to enable it; --timescale=require makes that
// an error. On a machine with TimescaleDB the non-preloaded case is a
// private cluster started without the preload; without it, the test
// server shows the not-installed case.
func TestSetupModeWithoutUsableTimescale(t *testing.T) {
	ctx := context.Background()
	bin, err := localpg.FindBin()
	if err != nil {
		t.Fatal(err)
	}
	var s *store.Store
	want := "not installed"
	if _, ok := localpg.TimescaleInstalled(bin); ok {
		lp := &localpg.Cluster{Dir: filepath.Join(storetest.DataDir(t), "pg"), WithoutTimescale: true}
		u, err := lp.Start(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lp.Stop() })
		s = storetest.Open(t, u, nil)
		if _, err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		want = "not preloaded"
	} else {
		s = storetest.NewStore(t)
	}
	db := storetest.Pool(t, s)
	mode, err := s.SetupMode(ctx, store.TimescaleAuto, store.TimescaleOptions{})
	if err != nil || mode.Timescale || !strings.Contains(mode.Why, want) || !strings.Contains(mode.Why, "shared_preload_libraries") {
		t.Fatalf("SetupMode(auto) = %+v, %v; want plain mode saying %q and how to enable it", mode, err, want)
	}
	if mode.String() != "plain PostgreSQL" {
		t.Errorf("mode reads %q", mode)
	}
	if _, err := s.SetupMode(ctx, store.TimescaleRequire, store.TimescaleOptions{}); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("SetupMode(require) = %v; want an error saying %q", err, want)
	}
	// The database still works in plain mode.
	if _, err := db.Exec(ctx, `INSERT INTO host_samples (time, host, cpu_util_pct) VALUES (now(), 'h1', 12.5)`); err != nil {
		t.Fatalf("write in plain mode: %v", err)
	}
}

// Retention is the server's job, not TimescaleDB's: setup removes the
// retention policies an earlier version added, and adds none.
func TestSetupModeRemovesRetentionPolicies(t *testing.T) {
	ctx := context.Background()
	if !storetest.Mode(t).Timescale {
		t.Skip("plain PostgreSQL: no TimescaleDB policies to observe (TestApplyRetention covers retention here)")
	}
	s := storetest.NewStore(t)
	if _, err := storetest.Pool(t, s).Exec(ctx, `SELECT add_retention_policy('steps', drop_after => interval '30 days')`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		mode, err := s.SetupMode(ctx, store.TimescaleRequire, store.TimescaleOptions{})
		if err != nil || !mode.Timescale || mode.String() != "TimescaleDB "+mode.Version {
			t.Fatalf("SetupMode = %+v, %v; want TimescaleDB", mode, err)
		}
	}
	var n int
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT count(*) FROM timescaledb_information.jobs WHERE proc_name = 'policy_retention'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d TimescaleDB retention policies after setup, want 0", n)
	}
}
