package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store/storetest"
)

// TestRankHostFollowsTheNewestSample: a rank's host is the host of its
// newest GPU sample, whatever order the batches come in, and its row is
// written again only when the host changes, not by every sample.
func TestRankHostFollowsTheNewestSample(t *testing.T) {
	s := storetest.NewStore(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	sample := func(host string, sec int) string {
		return fmt.Sprintf(`{"kind":"gpu","time":%q,"host":%q,"gpu":0,"run_id":"r","rank":3,"util_pct":50}`,
			t0.Add(time.Duration(sec)*time.Second).Format(time.RFC3339Nano), host)
	}
	host := func() string {
		t.Helper()
		h, err := s.RankHosts(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		return h[3]
	}
	version := func() string {
		t.Helper()
		var v string
		if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT xmin::text FROM rank_hosts WHERE run_id = 'r' AND rank = 3`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}

	mustWrite(t, s, sample("a", 10))
	first := version()
	for sec := 11; sec < 20; sec++ {
		mustWrite(t, s, sample("a", sec))
	}
	if got := host(); got != "a" {
		t.Fatalf("host %q, want a", got)
	}
	if v := version(); v != first {
		t.Errorf("the row was written again by samples of the same host (xmin %s, then %s)", first, v)
	}
	mustWrite(t, s, sample("b", 30)) // the rank moved
	mustWrite(t, s, sample("a", 25)) // a late batch from before the move
	if got := host(); got != "b" {
		t.Errorf("after a late sample of the old host: %q, want b", got)
	}
	mustWrite(t, s, sample("a", 40)) // moved back
	if got := host(); got != "a" {
		t.Errorf("after moving back: %q, want a", got)
	}
}
