package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
)

// mergeStmt is one statement of the merge.
type mergeStmt struct {
	kind, sql string
	args      []any
	count     bool // the statement answers count(*) rather than a tag
	discard   bool // its rows written count for nothing (a DELETE of replaced rows)
}

// merge moves the temporary tables into the real ones, marks rollups dirty
// and commits, in one round trip, and returns the rows written per kind.
func (b *batchPlan) merge(ctx context.Context, tx batchConn) (map[string]int, error) {
	var stmts []mergeStmt
	written := map[string]int{}
	for _, t := range b.tables() {
		if t.temp == t.target {
			written[t.kind] += t.n
			continue
		}
		if b.bySegment(t.kind) {
			stmts = append(stmts, b.segmentStmts(t.kind)...)
			continue
		}
		switch t.kind {
		case api.KindStep:
			stmts = append(stmts, mergeStmt{kind: t.kind, sql: mergeSteps, count: true})
		case api.KindLayers:
			stmts = append(stmts, mergeStmt{kind: t.kind, sql: mergeLayers, count: true})
		case api.KindEval:
			stmts = append(stmts, mergeStmt{kind: t.kind, sql: mergeEvals, count: true})
		case api.KindGPU:
			stmts = append(stmts, mergeStmt{kind: t.kind, sql: newGPUMarks, discard: true},
				mergeStmt{kind: t.kind, sql: mergeGPU, count: true})
		case api.KindHost:
			stmts = append(stmts, mergeStmt{kind: t.kind, sql: mergeHost, count: true})
		case api.KindMemory:
			stmts = append(stmts, mergeStmt{kind: t.kind, sql: mergeMemory})
		case api.KindEvent:
			if t.temp == "tmp_untimed_events" {
				stmts = append(stmts, mergeStmt{kind: t.kind, sql: mergeUntimedEvents})
			} else {
				stmts = append(stmts, mergeStmt{kind: t.kind, sql: mergeEvents})
			}
		}
	}
	dirtyRuns, dirtyRanks, dirtyBlocks := b.directDirty()
	q := &pgx.Batch{}
	var settings []string
	if len(stmts) > 0 && !b.timescale {
		// The temporary tables have no statistics, and with a guess the
		// planner may hash the whole of steps or layer_times to join a few
		// hundred rows. Probing the unique indexes row by row is what a
		// batch wants whatever the tables' size; SET LOCAL ends with the
		// transaction. (On TimescaleDB the segment statements bound every
		// scan by constants instead, and a nested loop would decompress a
		// batch once per row: batch_compressed.go.)
		settings = []string{`SET LOCAL enable_hashjoin = off`, `SET LOCAL enable_mergejoin = off`}
	}
	for _, s := range settings {
		q.Queue(s)
	}
	for _, s := range stmts {
		q.Queue(s.sql, s.args...)
	}
	if len(dirtyRuns) > 0 {
		q.Queue(`INSERT INTO rollup_dirty (run_id, rank, block)
			SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[]) ORDER BY 1, 2, 3
			ON CONFLICT (run_id, rank, block) DO UPDATE SET seq = nextval('rollup_dirty_seq')`, dirtyRuns, dirtyRanks, dirtyBlocks)
	}
	nRuns := b.runUpdates(q)
	end := "COMMIT"
	if b.rollback {
		end = "ROLLBACK"
	}
	q.Queue(end)
	br := tx.SendBatch(ctx, q)
	for range settings {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return nil, fmt.Errorf("store: write batch: plan settings: %w", err)
		}
	}
	for _, s := range stmts {
		if s.count {
			var n int64
			if err := br.QueryRow().Scan(&n); err != nil {
				br.Close()
				return nil, fmt.Errorf("store: write batch: merge %s: %w", s.kind, err)
			}
			written[s.kind] += int(n)
			continue
		}
		tag, err := br.Exec()
		if err != nil {
			br.Close()
			return nil, fmt.Errorf("store: write batch: merge %s: %w", s.kind, err)
		}
		if !s.discard {
			written[s.kind] += int(tag.RowsAffected())
		}
	}
	if len(dirtyRuns) > 0 {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return nil, fmt.Errorf("store: write batch: mark rollups dirty: %w", err)
		}
	}
	for i := 0; i < nRuns; i++ {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return nil, fmt.Errorf("store: write batch: update runs: %w", err)
		}
	}
	tag, err := br.Exec()
	if err == nil && tag.String() != end {
		// COMMIT of a failed transaction answers ROLLBACK, not an error.
		err = fmt.Errorf("transaction rolled back (%s)", tag)
	}
	if err != nil {
		br.Close()
		return nil, fmt.Errorf("store: write batch: commit: %w", err)
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("store: write batch: commit: %w", err)
	}
	return written, nil
}

// mergeNewest is the merge of a table keyed by run, by the column group
// and by step (steps, layer_times, evals) from its tmp_ twin: the newest
// version of each key in the batch deletes stored versions with an older
// time and is inserted unless a version with the same or a newer time is
// stored. The deleted rows are all older than the inserted one, so both
// parts can share one statement snapshot. With dirty, every rollup block
// (step / 100) it writes into gets its marker set or bumped in the same
// statement. The statement answers the rows inserted.
func mergeNewest(table, group string, dirty bool) string {
	mark := ""
	if dirty {
		mark = `
	), dirty AS (
		INSERT INTO rollup_dirty (run_id, rank, block)
		SELECT DISTINCT run_id, rank, step / 100 FROM ins ORDER BY 1, 2, 3
		ON CONFLICT (run_id, rank, block) DO UPDATE SET seq = nextval('rollup_dirty_seq')`
	}
	return strings.NewReplacer("TABLE", table, "GROUP", group, "MARK", mark).Replace(`WITH src AS (
		SELECT DISTINCT ON (run_id, GROUP, step) * FROM tmp_TABLE ORDER BY run_id, GROUP, step, time DESC
	), del AS (
		DELETE FROM TABLE AS t USING src
		WHERE t.run_id = src.run_id AND t.GROUP = src.GROUP AND t.step = src.step AND t.time < src.time
	), ins AS (
		INSERT INTO TABLE SELECT src.* FROM src
		WHERE NOT EXISTS (SELECT 1 FROM TABLE AS t
			WHERE t.run_id = src.run_id AND t.GROUP = src.GROUP AND t.step = src.step AND t.time >= src.time)
		ON CONFLICT DO NOTHING
		RETURNING run_id, GROUP, stepMARK
	)
	SELECT count(*) FROM ins`)
}
