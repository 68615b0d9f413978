package storetest_test

import (
	"context"
	"os"
	"testing"

	"github.com/deepseed/deepseed/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

// The tests' databases are what DeepSeed makes of the server: hypertables
// in TimescaleDB mode, plain tables otherwise, and writable either way.
// ./test.sh runs this test first to print the mode.
func TestDatabaseMode(t *testing.T) {
	ctx := context.Background()
	mode := storetest.Mode(t)
	t.Logf("database mode: %s", mode)
	if os.Getenv("DEEPSEED_TEST_TIMESCALE") == "require" && !mode.Timescale {
		t.Fatalf("DEEPSEED_TEST_TIMESCALE=require but the tests run on %s: %s", mode, mode.Why)
	}
	s := storetest.NewStore(t)
	var ext int
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT count(*) FROM pg_extension WHERE extname = 'timescaledb'`).Scan(&ext); err != nil {
		t.Fatal(err)
	}
	if (ext == 1) != mode.Timescale {
		t.Fatalf("mode %s but timescaledb extension rows = %d", mode, ext)
	}
	if mode.Timescale {
		var n int
		if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT count(*) FROM timescaledb_information.hypertables
			WHERE hypertable_name IN ('steps', 'layer_times', 'evals', 'events', 'gpu_samples', 'host_samples')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 6 {
			t.Fatalf("%d of 6 time-series tables are hypertables", n)
		}
	}
	if _, err := storetest.Pool(t, s).Exec(ctx, `INSERT INTO host_samples (time, host, cpu_util_pct) VALUES (now(), 'h1', 12.5)`); err != nil {
		t.Fatalf("write: %v", err)
	}
	// Two databases from one template at once: nothing else holds it.
	storetest.NewDatabase(t)
	storetest.NewDatabase(t)
}
