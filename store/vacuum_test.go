package store_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store/storetest"
)

// TestVacuumChurnedAfterMinuteRowsTurnOver writes a GPU's samples in many
// small batches, as a collector sends them, so that every batch updates the
// minute rows it falls in, and requires VacuumChurned to vacuum
// gpu_device_minutes once the server counts those dead rows, to leave it
// with fewer dead rows than the batches made, and not to vacuum it again
// right away.
func TestVacuumChurnedAfterMinuteRowsTurnOver(t *testing.T) {
	s := storetest.NewStore(t)
	ctx := context.Background()
	pool := storetest.Pool(t, s)
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	// 8 GPUs × 120 minutes, a sample of each a minute in each of 30
	// batches: 960 minute rows, each updated 30 times.
	for b := 0; b < 30; b++ {
		var lines []string
		for m := 0; m < 120; m++ {
			at := t0.Add(time.Duration(m)*time.Minute + time.Duration(b)*time.Second).Format(time.RFC3339Nano)
			for g := 0; g < 8; g++ {
				lines = append(lines, fmt.Sprintf(`{"kind":"gpu","time":%q,"host":"h0","gpu":%d,"run_id":"r","rank":%d,"util_pct":%d}`,
					at, g, g, (m+b+g)%100))
			}
		}
		mustWrite(t, s, lines...)
	}
	dead := func() (n int64) {
		if err := pool.QueryRow(ctx, `SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'gpu_device_minutes'), 0)`).
			Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	isMinutes := func(rel string) bool { return strings.HasSuffix(rel, ".gpu_device_minutes") }
	// The server counts dead rows in its statistics a moment after the
	// transactions that made them.
	var before int64
	deadline := time.Now().Add(time.Minute)
	for {
		before = dead()
		rels, err := s.VacuumChurned(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(rels, isMinutes) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gpu_device_minutes never vacuumed (%d dead rows counted); vacuumed %v", before, rels)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if before < 20000 {
		t.Fatalf("vacuumed at %d dead rows, below the bound", before)
	}
	if after := dead(); after >= before/10 {
		t.Errorf("%d dead rows after the vacuum, %d before", after, before)
	}
	rels, err := s.VacuumChurned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(rels, isMinutes) {
		t.Errorf("gpu_device_minutes vacuumed again at once: %v", rels)
	}
}
