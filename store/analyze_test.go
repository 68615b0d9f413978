package store_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store/storetest"
)

// TestAnalyzeStaleAfterABulkLoad writes more steps than the staleness
// bound and requires AnalyzeStale to analyze steps (on TimescaleDB, its
// chunks) once the server's statistics count the rows, and not again
// until they change as much again.
func TestAnalyzeStaleAfterABulkLoad(t *testing.T) {
	s := storetest.NewStore(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	recs := []api.Record{{Run: &api.Run{Kind: "run", RunID: "bulk", Project: "p", StartedAt: api.T(t0)}}}
	for rank := 0; rank < 8; rank++ {
		for st := int64(0); st < 4000; st++ {
			recs = append(recs, api.Record{Step: &api.Step{Kind: "step", RunID: "bulk", Rank: rank, Step: api.Ptr(st),
				Time: api.T(t0.Add(time.Duration(st) * time.Second)), Loss: api.F(1)}})
		}
	}
	if _, err := s.WriteBatch(ctx, recs); err != nil {
		t.Fatal(err)
	}
	isSteps := func(rel string) bool {
		return rel == "public.steps" || (s.Timescale && strings.HasPrefix(rel, "_timescaledb_internal."))
	}
	// The server counts changes in its statistics a moment after the
	// transaction that made them.
	deadline := time.Now().Add(time.Minute)
	for {
		rels, err := s.AnalyzeStale(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(rels, isSteps) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("32,000 new steps never found stale; analyzed %v", rels)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second)
	rels, err := s.AnalyzeStale(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(rels, isSteps) {
		t.Errorf("steps analyzed again with nothing written since: %v", rels)
	}
}
