package ingest

import (
	"context"
	"testing"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// Waiting batches of more ranks together than a batch may lock one by one
// are combined into groups that each stay within store.MaxBatchLocks, so
// no combined write is a wide batch, which would write beside no other.
func TestCombinedGroupsStayWithinTheLockLimit(t *testing.T) {
	c := &combiner{writers: 1}
	const batches, ranksEach = 200, 8
	for b := 0; b < batches; b++ {
		var recs []api.Record
		for r := 0; r < ranksEach; r++ {
			recs = append(recs, api.Record{Step: &api.Step{RunID: "big", Rank: b*ranksEach + r}})
		}
		c.pending = append(c.pending, &combined{ctx: context.Background(), recs: recs, keys: store.LockKeys(recs)})
	}
	taken, groups := 0, 0
	for {
		group := c.take()
		if group == nil {
			break
		}
		groups++
		var recs []api.Record
		for _, g := range group {
			recs = append(recs, g.recs...)
		}
		if n := len(store.LockKeys(recs)); n > store.MaxBatchLocks {
			t.Fatalf("group %d of %d batches takes %d locks, more than %d", groups, len(group), n, store.MaxBatchLocks)
		}
		taken += len(group)
	}
	if taken != batches {
		t.Fatalf("%d batches taken, want %d", taken, batches)
	}
	// 1,600 ranks and a run lock: four groups at least.
	if want := (batches*ranksEach + store.MaxBatchLocks - 1) / store.MaxBatchLocks; groups < want {
		t.Fatalf("%d groups, want %d or more", groups, want)
	}
}
