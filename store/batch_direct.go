package store

import (
	"sort"

	"github.com/deepseed/deepseed/api"
)

// The direct path: a batch whose step, layers and evaluation keys are all
// new goes straight into its tables, without the temporary tables and the
// merge (batch_merge.go).

// directCheck is a query answering whether a table already holds any key
// in the batch's step ranges.
type directCheck struct {
	kind string
	sql  string
	args []any
}

// directChecks returns a check for each of steps, layers and evals whose
// keys the batch does not repeat; a batch that repeats a key goes through
// the merge, which keeps the newest.
func (b *batchPlan) directChecks() []directCheck {
	type rankKey struct {
		run  string
		rank int
	}
	type stepRange struct{ lo, hi int64 }
	// ranksCheck builds the check of a table keyed by (run_id, rank, step).
	ranksCheck := func(kind, table string, n int, key func(i int) (string, int, int64)) *directCheck {
		type rowKey struct {
			rankKey
			step int64
		}
		seen := make(map[rowKey]struct{}, n)
		ranges := map[rankKey]stepRange{}
		var order []rankKey
		for i := 0; i < n; i++ {
			run, rank, step := key(i)
			k := rankKey{run, rank}
			if _, dup := seen[rowKey{k, step}]; dup {
				return nil
			}
			seen[rowKey{k, step}] = struct{}{}
			r, ok := ranges[k]
			if !ok {
				order = append(order, k)
				r = stepRange{step, step}
			}
			r.lo, r.hi = min(r.lo, step), max(r.hi, step)
			ranges[k] = r
		}
		runs := make([]string, len(order))
		ranks := make([]int32, len(order))
		los := make([]int64, len(order))
		his := make([]int64, len(order))
		for i, k := range order {
			runs[i], ranks[i], los[i], his[i] = k.run, int32(k.rank), ranges[k].lo, ranges[k].hi
		}
		return &directCheck{kind, `SELECT EXISTS (SELECT 1 FROM unnest($1::text[], $2::int[], $3::bigint[], $4::bigint[]) AS k(run_id, rank, lo, hi),
			LATERAL (SELECT 1 FROM ` + table + ` AS t
				WHERE t.run_id = k.run_id AND t.rank = k.rank AND t.step BETWEEN k.lo AND k.hi LIMIT 1) AS hit)`,
			[]any{runs, ranks, los, his}}
	}
	var checks []directCheck
	if len(b.steps) > 0 {
		if c := ranksCheck(api.KindStep, "steps", len(b.steps), func(i int) (string, int, int64) {
			s := b.steps[i]
			return s.RunID, s.Rank, *s.Step
		}); c != nil {
			checks = append(checks, *c)
		}
	}
	if len(b.layers) > 0 {
		if c := ranksCheck(api.KindLayers, "layer_times", len(b.layers), func(i int) (string, int, int64) {
			l := b.layers[i]
			return l.RunID, l.Rank, *l.Step
		}); c != nil {
			checks = append(checks, *c)
		}
	}
	if len(b.evals) > 0 {
		// Evals are keyed by split instead of rank.
		type evalKey struct {
			run, split string
			step       int64
		}
		seen := map[evalKey]struct{}{}
		var runs, splits []string
		var steps []int64
		dup := false
		for _, e := range b.evals {
			k := evalKey{e.RunID, orDefault(e.Split, "val"), *e.Step}
			if _, ok := seen[k]; ok {
				dup = true
				break
			}
			seen[k] = struct{}{}
			runs, splits, steps = append(runs, k.run), append(splits, k.split), append(steps, k.step)
		}
		if !dup {
			checks = append(checks, directCheck{api.KindEval, `SELECT EXISTS (SELECT 1 FROM unnest($1::text[], $2::text[], $3::bigint[]) AS k(run_id, split, step),
				LATERAL (SELECT 1 FROM evals AS t WHERE t.run_id = k.run_id AND t.split = k.split AND t.step = k.step LIMIT 1) AS hit)`,
				[]any{runs, splits, steps}})
		}
	}
	return checks
}

// directDirty returns the step blocks (run, rank, step / 100) of the step
// and layers rows written directly, which the merge statements would have
// marked in rollup_dirty, sorted.
func (b *batchPlan) directDirty() (runs []string, ranks []int32, blocks []int64) {
	type block struct {
		run   string
		rank  int
		block int64
	}
	set := map[block]struct{}{}
	if b.direct[api.KindStep] {
		for _, s := range b.steps {
			set[block{s.RunID, s.Rank, *s.Step / 100}] = struct{}{}
		}
	}
	if b.direct[api.KindLayers] {
		for _, l := range b.layers {
			set[block{l.RunID, l.Rank, *l.Step / 100}] = struct{}{}
		}
	}
	keys := make([]block, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, c := keys[i], keys[j]
		if a.run != c.run {
			return a.run < c.run
		}
		if a.rank != c.rank {
			return a.rank < c.rank
		}
		return a.block < c.block
	})
	for _, k := range keys {
		runs, ranks, blocks = append(runs, k.run), append(ranks, int32(k.rank)), append(blocks, k.block)
	}
	return runs, ranks, blocks
}
