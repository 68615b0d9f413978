package store

import (
	"context"
	"fmt"
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
// the plain merge (write.go) decompresses every batch of every chunk, and
// a DELETE leaves all of them decompressed. Here each segment the batch
// writes gets statements of its own, with run, rank and step range bound
// as parameters and planned with their values (plan_cache_mode), and the
// DELETE runs only for segments where a probe found stored rows older
// than the batch's: a retry, whose rows are all stored already, reads the
// batches it overlaps and decompresses none; a resume decompresses the
// batches holding the steps it replaces.

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

// segments returns the segments of kind in the batch, in key order.
func (b *batchPlan) segments(kind string) []*segment {
	type key struct {
		run  string
		rank int32
	}
	idx := map[key]*segment{}
	var out []*segment
	add := func(run string, rank int32, step int64) {
		k := key{run, rank}
		s, ok := idx[k]
		if !ok {
			s = &segment{run: run, rank: rank, lo: step, hi: step}
			idx[k] = s
			out = append(out, s)
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
	return out
}

// segmentSQL holds the three statements of one table's segment merge.
type segmentSQL struct {
	probe, delete, insert string
}

// Steps and layer_times: $1 run, $2 rank, $3 and $4 the step range.
func stepSegmentSQL(table string) segmentSQL {
	r := strings.NewReplacer("TABLE", table)
	return segmentSQL{
		probe: r.Replace(`SELECT count(*), coalesce(min(t.step), 0), coalesce(max(t.step), 0)
			FROM TABLE AS t JOIN tmp_TABLE AS s ON s.run_id = $1 AND s.rank = $2 AND s.step = t.step AND t.time < s.time
			WHERE t.run_id = $1 AND t.rank = $2 AND t.step BETWEEN $3 AND $4`),
		delete: r.Replace(`DELETE FROM TABLE AS t
			USING (SELECT step, max(time) AS time FROM tmp_TABLE WHERE run_id = $1 AND rank = $2 GROUP BY step) AS s
			WHERE t.run_id = $1 AND t.rank = $2 AND t.step BETWEEN $3 AND $4 AND t.step = s.step AND t.time < s.time`),
		insert: r.Replace(`WITH src AS (
			SELECT DISTINCT ON (step) * FROM tmp_TABLE WHERE run_id = $1 AND rank = $2 ORDER BY step, time DESC
		), ins AS (
			INSERT INTO TABLE SELECT src.* FROM src
			WHERE NOT EXISTS (SELECT 1 FROM TABLE AS t
				WHERE t.run_id = $1 AND t.rank = $2 AND t.step BETWEEN $3 AND $4 AND t.step = src.step AND t.time >= src.time)
			ON CONFLICT DO NOTHING
			RETURNING step
		), dirty AS (
			INSERT INTO rollup_dirty (run_id, rank, block)
			SELECT DISTINCT $1::text, $2::int, step / 100 FROM ins ORDER BY 3
			ON CONFLICT (run_id, rank, block) DO UPDATE SET seq = nextval('rollup_dirty_seq')
		)
		SELECT count(*) FROM ins`),
	}
}

// Evals: $1 run, $2 and $3 the step range.
var evalSegmentSQL = segmentSQL{
	probe: `SELECT count(*), coalesce(min(t.step), 0), coalesce(max(t.step), 0)
		FROM evals AS t JOIN tmp_evals AS s ON s.run_id = $1 AND s.split = t.split AND s.step = t.step AND t.time < s.time
		WHERE t.run_id = $1 AND t.step BETWEEN $2 AND $3`,
	delete: `DELETE FROM evals AS t
		USING (SELECT split, step, max(time) AS time FROM tmp_evals WHERE run_id = $1 GROUP BY split, step) AS s
		WHERE t.run_id = $1 AND t.step BETWEEN $2 AND $3 AND t.split = s.split AND t.step = s.step AND t.time < s.time`,
	insert: `WITH src AS (
		SELECT DISTINCT ON (split, step) * FROM tmp_evals WHERE run_id = $1 ORDER BY split, step, time DESC
	), ins AS (
		INSERT INTO evals SELECT src.* FROM src
		WHERE NOT EXISTS (SELECT 1 FROM evals AS t
			WHERE t.run_id = $1 AND t.step BETWEEN $2 AND $3 AND t.split = src.split AND t.step = src.step AND t.time >= src.time)
		ON CONFLICT DO NOTHING
		RETURNING 1
	)
	SELECT count(*) FROM ins`,
}

var (
	stepsSegmentSQL  = stepSegmentSQL("steps")
	layersSegmentSQL = stepSegmentSQL("layer_times")
)

// segmentTable is a kind merged by segment on TimescaleDB, with the
// arguments of its statements for a segment and step range.
type segmentTable struct {
	kind string
	sql  segmentSQL
	args func(s *segment, lo, hi int64) []any
}

func rankArgs(s *segment, lo, hi int64) []any { return []any{s.run, s.rank, lo, hi} }
func runArgs(s *segment, lo, hi int64) []any  { return []any{s.run, lo, hi} }

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
// TimescaleDB sees the segment and step range as constants.
func (b *batchPlan) probeStale(ctx context.Context, tx batchConn) error {
	b.segs = map[string][]*segment{}
	q := &pgx.Batch{}
	q.Queue(`SET LOCAL plan_cache_mode = force_custom_plan`)
	type probe struct {
		kind string
		seg  *segment
	}
	var probes []probe
	for _, t := range segmentTables {
		if !b.bySegment(t.kind) {
			continue
		}
		segs := b.segments(t.kind)
		b.segs[t.kind] = segs
		for _, s := range segs {
			q.Queue(t.sql.probe, t.args(s, s.lo, s.hi)...)
			probes = append(probes, probe{t.kind, s})
		}
	}
	if len(probes) == 0 {
		return nil
	}
	br := tx.SendBatch(ctx, q)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("store: write batch: plan settings: %w", err)
	}
	for _, p := range probes {
		if err := br.QueryRow().Scan(&p.seg.stale, &p.seg.staleLo, &p.seg.staleHi); err != nil {
			return fmt.Errorf("store: write batch: probe stored %s of run %q: %w", p.kind, p.seg.run, err)
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("store: write batch: probe stored rows: %w", err)
	}
	return nil
}

// segmentStmts returns the merge statements of kind by segment: a DELETE
// where the probe found older rows, and the INSERT.
func (b *batchPlan) segmentStmts(kind string) []mergeStmt {
	var t segmentTable
	for _, c := range segmentTables {
		if c.kind == kind {
			t = c
		}
	}
	var out []mergeStmt
	for _, s := range b.segs[kind] {
		if s.stale > 0 {
			out = append(out, mergeStmt{kind: kind, sql: t.sql.delete, args: t.args(s, s.staleLo, s.staleHi), discard: true})
		}
		out = append(out, mergeStmt{kind: kind, sql: t.sql.insert, args: t.args(s, s.lo, s.hi), count: true})
	}
	return out
}
