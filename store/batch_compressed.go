package store

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
)

// Merging on TimescaleDB.
//
// A compressed chunk keeps each segment (a run's rank for steps and
// layer_times, a run for evals) in batches of up to 1,000 rows, with the
// smallest and largest step of each batch beside it. TimescaleDB can skip
// a batch only when a statement names the segment and the step range as
// constants: a join against the batch's temporary table names nothing, so
// the plain merge (batch.go) decompresses every batch of every chunk, and
// a DELETE leaves all of them decompressed. Here the segments the batch
// writes get statements of their own, with run, ranks and step range
// bound as parameters and planned with their values (plan_cache_mode),
// and the DELETE runs only for segments where a probe found stored rows
// older than the batch's: a retry, whose rows are all stored already,
// reads the batches it overlaps and decompresses none; a resume
// decompresses the batches holding the steps it replaces.
//
// The ranks of a run that a batch brings the same steps for (the ranks of
// a resumed run, sent together) share their statements, naming the ranks
// as a list (rank = ANY), which TimescaleDB reads as constants too: each
// statement is planned once for all of them, and planning a statement
// over a hypertable and its chunks is what a segment's statement cost
// most of the time (a resume of 16 ranks in one batch ran 96 statements).

// segment is one run's rank (steps, layers) or one run (evals) in a batch,
// with the range of steps the batch holds for it.
type segment struct {
	run    string
	rank   int32
	lo, hi int64
	// staleLo and staleHi bound the stored steps that the batch replaces,
	// found by probeStale; stale is their number.
	stale            int64
	staleLo, staleHi int64
}

// segGroup is the segments of one run that a batch holds the same range
// of steps for, in rank order; they share their statements.
type segGroup struct {
	run    string
	lo, hi int64
	segs   []*segment
}

// ranks returns the ranks of the group's segments that pick accepts.
func (g *segGroup) ranks(pick func(*segment) bool) []int32 {
	var out []int32
	for _, s := range g.segs {
		if pick(s) {
			out = append(out, s.rank)
		}
	}
	return out
}

// segments returns the segments of kind in the batch, grouped by run and
// step range, in key order.
func (b *batchPlan) segments(kind string) []*segGroup {
	type key struct {
		run  string
		rank int32
	}
	idx := map[key]*segment{}
	var segs []*segment
	add := func(run string, rank int32, step int64) {
		k := key{run, rank}
		s, ok := idx[k]
		if !ok {
			s = &segment{run: run, rank: rank, lo: step, hi: step}
			idx[k] = s
			segs = append(segs, s)
		}
		s.lo, s.hi = min(s.lo, step), max(s.hi, step)
	}
	switch kind {
	case api.KindStep:
		for _, s := range b.steps {
			add(s.RunID, int32(s.Rank), *s.Step)
		}
	case api.KindLayers:
		for _, l := range b.layers {
			add(l.RunID, int32(l.Rank), *l.Step)
		}
	case api.KindEval:
		for _, e := range b.evals {
			add(e.RunID, 0, *e.Step)
		}
	}
	sort.Slice(segs, func(i, j int) bool {
		if segs[i].run != segs[j].run {
			return segs[i].run < segs[j].run
		}
		return segs[i].rank < segs[j].rank
	})
	type groupKey struct {
		run    string
		lo, hi int64
	}
	gidx := map[groupKey]*segGroup{}
	var out []*segGroup
	for _, s := range segs {
		k := groupKey{s.run, s.lo, s.hi}
		g, ok := gidx[k]
		if !ok {
			g = &segGroup{run: s.run, lo: s.lo, hi: s.hi}
			gidx[k] = g
			out = append(out, g)
		}
		g.segs = append(g.segs, s)
	}
	return out
}

// segmentSQL holds the three statements of one table's segment merge. The
// probe answers, per rank with stored rows older than the batch's, the
// rank, their number and their smallest and largest step.
type segmentSQL struct {
	probe, delete, insert string
}

// segmentMerge returns the statements of table's merge by segment, keyed
// by run, by the column group and by step as mergeNewest's, and choosing
// the same rows. With ranked (steps, layer_times), a segment is a run's
// rank: the statements take $1 run, $2 ranks, $3 and $4 the step range,
// and every rollup block the insert writes into gets its marker set or
// bumped. Without (evals), a segment is a run: $1 run, $2 and $3 the step
// range, and the probe answers rank 0 when it finds stored rows.
func segmentMerge(table, group string, ranked bool) segmentSQL {
	seg, src := `t.run_id = $1 AND t.step BETWEEN $2 AND $3`, `run_id = $1`
	rank, per, mark := `0`, `HAVING count(*) > 0`, ""
	if ranked {
		seg, src = `t.run_id = $1 AND t.rank = ANY($2) AND t.step BETWEEN $3 AND $4`, `run_id = $1 AND rank = ANY($2)`
		rank, per = `t.rank`, `GROUP BY t.rank`
		mark = `
		), dirty AS (
			INSERT INTO rollup_dirty (run_id, rank, block)
			SELECT DISTINCT $1::text, rank, step / 100 FROM ins ORDER BY 2, 3
			ON CONFLICT (run_id, rank, block) DO UPDATE SET seq = nextval('rollup_dirty_seq')`
	}
	r := strings.NewReplacer("{table}", table, "{group}", group, "{seg}", seg, "{src}", src,
		"{rank}", rank, "{per}", per, "{mark}", mark)
	return segmentSQL{
		probe: r.Replace(`SELECT {rank}, count(*), min(t.step), max(t.step)
			FROM {table} AS t JOIN tmp_{table} AS s ON s.run_id = $1 AND s.{group} = t.{group} AND s.step = t.step AND t.time < s.time
			WHERE {seg}
			{per}`),
		delete: r.Replace(`DELETE FROM {table} AS t
			USING (SELECT {group}, step, max(time) AS time FROM tmp_{table} WHERE {src} GROUP BY {group}, step) AS s
			WHERE {seg}
			  AND t.{group} = s.{group} AND t.step = s.step AND t.time < s.time`),
		insert: r.Replace(`WITH src AS (
			SELECT DISTINCT ON ({group}, step) * FROM tmp_{table} WHERE {src} ORDER BY {group}, step, time DESC
		), ins AS (
			INSERT INTO {table} SELECT src.* FROM src
			WHERE NOT EXISTS (SELECT 1 FROM {table} AS t
				WHERE {seg}
				  AND t.{group} = src.{group} AND t.step = src.step AND t.time >= src.time)
			ON CONFLICT DO NOTHING
			RETURNING {group}, step{mark}
		)
		SELECT count(*) FROM ins`),
	}
}

var (
	stepsSegmentSQL  = segmentMerge("steps", "rank", true)
	layersSegmentSQL = segmentMerge("layer_times", "rank", true)
	evalSegmentSQL   = segmentMerge("evals", "split", false)
)

// segmentTable is a kind merged by segment on TimescaleDB, with the
// arguments of its statements for a run, its ranks and a step range.
type segmentTable struct {
	kind string
	sql  segmentSQL
	args func(run string, ranks []int32, lo, hi int64) []any
}

func rankArgs(run string, ranks []int32, lo, hi int64) []any { return []any{run, ranks, lo, hi} }
func runArgs(run string, _ []int32, lo, hi int64) []any      { return []any{run, lo, hi} }

func anySegment(*segment) bool     { return true }
func staleSegment(s *segment) bool { return s.stale > 0 }

var segmentTables = []segmentTable{
	{api.KindStep, stepsSegmentSQL, rankArgs},
	{api.KindLayers, layersSegmentSQL, rankArgs},
	{api.KindEval, evalSegmentSQL, runArgs},
}

// bySegment reports whether kind is merged segment by segment: on
// TimescaleDB, for the kinds that go through a temporary table.
func (b *batchPlan) bySegment(kind string) bool {
	if !b.timescale || b.direct[kind] {
		return false
	}
	switch kind {
	case api.KindStep, api.KindLayers, api.KindEval:
		return true
	}
	return false
}

// probeStale finds, for every segment merged by segment, the stored rows
// that the batch replaces, in one round trip. The statements are planned
// with their parameters' values for the rest of the transaction, so that
// TimescaleDB sees the segments and step ranges as constants.
func (b *batchPlan) probeStale(ctx context.Context, tx batchConn) error {
	b.groups = map[string][]*segGroup{}
	q := &pgx.Batch{}
	q.Queue(`SET LOCAL plan_cache_mode = force_custom_plan`)
	// The temporary table has no statistics and a chunk just written has
	// stale ones: with a guess of a row or two on each side the planner
	// joins by a nested loop, which read the temporary table once per
	// stored row (a batch of 8,000 ranks sent again took 7 s in its probe,
	// 5 ms with a hash join) and, on a compressed chunk, decompresses a
	// batch once per row. The segment statements join by hash.
	q.Queue(noNestLoop)
	type probe struct {
		kind  string
		group *segGroup
	}
	var probes []probe
	for _, t := range segmentTables {
		if !b.bySegment(t.kind) {
			continue
		}
		groups := b.segments(t.kind)
		b.groups[t.kind] = groups
		for _, g := range groups {
			q.Queue(t.sql.probe, t.args(g.run, g.ranks(anySegment), g.lo, g.hi)...)
			probes = append(probes, probe{t.kind, g})
		}
	}
	if len(probes) == 0 {
		return nil
	}
	q.Queue(nestLoop)
	br := tx.SendBatch(ctx, q)
	defer br.Close()
	for i := 0; i < 2; i++ {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("store: write batch: plan settings: %w", err)
		}
	}
	for _, p := range probes {
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("store: write batch: probe stored %s of run %q: %w", p.kind, p.group.run, err)
		}
		for rows.Next() {
			var rank int32
			var stale, lo, hi int64
			if err := rows.Scan(&rank, &stale, &lo, &hi); err != nil {
				rows.Close()
				return fmt.Errorf("store: write batch: probe stored %s of run %q: %w", p.kind, p.group.run, err)
			}
			for _, s := range p.group.segs {
				if s.rank == rank {
					s.stale, s.staleLo, s.staleHi = stale, lo, hi
				}
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("store: write batch: probe stored %s of run %q: %w", p.kind, p.group.run, err)
		}
	}
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("store: write batch: plan settings: %w", err)
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("store: write batch: probe stored rows: %w", err)
	}
	return nil
}

// noNestLoop and nestLoop bracket the statements by segment (see
// probeStale), for the rest of the transaction's statements to be planned
// as before.
const (
	noNestLoop = `SET LOCAL enable_nestloop = off`
	nestLoop   = `SET LOCAL enable_nestloop = on`
)

// segmentStmts returns the merge statements of kind by segment group: a
// DELETE for the segments where the probe found older rows, over the
// steps it found, and the INSERT.
func (b *batchPlan) segmentStmts(kind string) []mergeStmt {
	var t segmentTable
	for _, c := range segmentTables {
		if c.kind == kind {
			t = c
		}
	}
	out := []mergeStmt{{kind: kind, sql: noNestLoop, discard: true}}
	for _, g := range b.groups[kind] {
		if stale := g.ranks(staleSegment); len(stale) > 0 {
			lo, hi := int64(0), int64(0)
			first := true
			for _, s := range g.segs {
				if s.stale > 0 {
					if first {
						lo, hi, first = s.staleLo, s.staleHi, false
					}
					lo, hi = min(lo, s.staleLo), max(hi, s.staleHi)
				}
			}
			out = append(out, mergeStmt{kind: kind, sql: t.sql.delete, args: t.args(g.run, stale, lo, hi), discard: true})
		}
		out = append(out, mergeStmt{kind: kind, sql: t.sql.insert, args: t.args(g.run, g.ranks(anySegment), g.lo, g.hi), count: true})
	}
	return append(out, mergeStmt{kind: kind, sql: nestLoop, discard: true})
}
