package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// Without the timescaledb extension SetupTimescale reports plain mode,
// changes nothing, and can run again at every start.
func TestSetupTimescalePlainPostgres(t *testing.T) {
	ctx := context.Background()
	s := storetest.NewStore(t)
	var available bool
	if err := s.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'timescaledb')`).Scan(&available); err != nil {
		t.Fatal(err)
	}
	if available {
		t.Skip("timescaledb is installed on this server: the plain path cannot be observed here")
	}
	for range 2 {
		on, version, err := s.SetupTimescale(ctx, store.TimescaleOptions{Retention: 90 * 24 * time.Hour, CompressAfter: 7 * 24 * time.Hour})
		if err != nil || on || version != "" {
			t.Fatalf("SetupTimescale = %v, %q, %v; want false, \"\", nil", on, version, err)
		}
	}
	if s.Timescale {
		t.Fatal("Store.Timescale is true on plain PostgreSQL")
	}
	var n int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_extension WHERE extname = 'timescaledb'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("timescaledb extension rows = %d, %v; want 0", n, err)
	}
	// The tables are still plain and writable.
	if _, err := s.Pool.Exec(ctx, `INSERT INTO host_samples (time, host, cpu_util_pct) VALUES (now(), 'h1', 12.5)`); err != nil {
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
