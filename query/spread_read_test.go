package query

import "testing"

// A short run of many ranks is read row by row at the panel's
// resolution; a long one from the stored spread, its straggler score in
// buckets wide enough that every rank's buckets fit the row budget.
func TestReadSpreadPlans(t *testing.T) {
	short := newReadSpread(0, 299, 1024, 800)
	if !short.rawFits || short.raw.Width != 1 || short.stored.Width != 100 {
		t.Errorf("300 steps of 1,024 ranks: raw %v (width %d), stored width %d; want step by step", short.rawFits, short.raw.Width, short.stored.Width)
	}
	if p, onRead := short.computed("step_ms"); !onRead || p.Width != 1 {
		t.Errorf("step_ms of a short run: on read %v at width %d, want step by step", onRead, p.Width)
	}
	long := newReadSpread(0, 99_999, 1024, 1000)
	if long.rawFits {
		t.Fatal("100,000 steps of 1,024 ranks read row by row")
	}
	if p, onRead := long.computed("step_ms"); onRead || p.Width != long.stored.Width {
		t.Errorf("step_ms of a long run: on read %v at width %d, want the stored spread", onRead, p.Width)
	}
	p, onRead := long.computed("straggler_score")
	buckets := 99_999/p.Width + 1
	if !onRead || p.Width%p.Rollup != 0 || 1024*buckets > spreadRowBudget || 1024*(99_999/(p.Width-p.Rollup)+1) <= spreadRowBudget {
		t.Errorf("straggler score of a long run: width %d (%d buckets of 1,024 ranks): want the narrowest whole rollups within %d", p.Width, buckets, spreadRowBudget)
	}
	// Few ranks of a short run fit too; a run too wide for the panel
	// keeps the stored buckets.
	if few := newReadSpread(0, 5_000, 20, 1000); !few.rawFits || few.raw.Width != 6 {
		t.Errorf("5,001 steps of 20 ranks: raw %v at width %d, want buckets of 6 steps", few.rawFits, few.raw.Width)
	}
}
