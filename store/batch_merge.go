package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
)

// Merge statements. Steps, layers and evals: the newest version of each key
// in the batch deletes stored versions with an older time and is inserted
// unless a version with the same or a newer time is stored. The deleted
// rows are all older than the inserted one, so both parts can share one
// statement snapshot.
var (
	mergeSteps  = mergeStepRows("steps")
	mergeLayers = mergeStepRows("layer_times")
)

// mergeStepRows is the merge of table, keyed by run, rank and step, from
// its tmp_ twin; every block it writes into gets its rollup marker set or
// bumped in the same statement.
func mergeStepRows(table string) string {
	return strings.NewReplacer("TABLE", table).Replace(`WITH src AS (
		SELECT DISTINCT ON (run_id, rank, step) * FROM tmp_TABLE ORDER BY run_id, rank, step, time DESC
	), del AS (
		DELETE FROM TABLE AS t USING src
		WHERE t.run_id = src.run_id AND t.rank = src.rank AND t.step = src.step AND t.time < src.time
	), ins AS (
		INSERT INTO TABLE SELECT src.* FROM src
		WHERE NOT EXISTS (SELECT 1 FROM TABLE AS t
			WHERE t.run_id = src.run_id AND t.rank = src.rank AND t.step = src.step AND t.time >= src.time)
		ON CONFLICT DO NOTHING
		RETURNING run_id, rank, step
	), dirty AS (
		INSERT INTO rollup_dirty (run_id, rank, block)
		SELECT DISTINCT run_id, rank, step / 100 FROM ins ORDER BY 1, 2, 3
		ON CONFLICT (run_id, rank, block) DO UPDATE SET seq = nextval('rollup_dirty_seq')
	)
	SELECT count(*) FROM ins`)
}

const (
	mergeEvals = `WITH src AS (
		SELECT DISTINCT ON (run_id, split, step) * FROM tmp_evals ORDER BY run_id, split, step, time DESC
	), del AS (
		DELETE FROM evals AS t USING src
		WHERE t.run_id = src.run_id AND t.split = src.split AND t.step = src.step AND t.time < src.time
	), ins AS (
		INSERT INTO evals SELECT src.* FROM src
		WHERE NOT EXISTS (SELECT 1 FROM evals AS t
			WHERE t.run_id = src.run_id AND t.split = src.split AND t.step = src.step AND t.time >= src.time)
		ON CONFLICT DO NOTHING
		RETURNING 1
	)
	SELECT count(*) FROM ins`

	// Samples from several collectors may overlap: inserting in key order
	// keeps two batches from waiting on each other's rows crosswise.
	// The samples written (not those already stored) are added to their
	// minute's sums in the same statement; each collector adds to its own
	// host's rows, so concurrent batches of one run do not queue on them.
	mergeGPU = `WITH ins AS (
		INSERT INTO gpu_samples SELECT * FROM tmp_gpu_samples ORDER BY host, gpu, time ON CONFLICT DO NOTHING
		RETURNING run_id, rank, host, time, util_pct, mem_used_bytes, mem_total_bytes
	), m AS (
		INSERT INTO gpu_minutes AS m (run_id, host, minute, samples, mem_n, mem_sum, mem_max, util_n, util_sum, util_min, total_max)
		SELECT run_id, host, date_trunc('minute', time), count(*), count(mem_used_bytes), sum(mem_used_bytes), max(mem_used_bytes),
		       count(util_pct), sum(util_pct), min(util_pct), max(mem_total_bytes)
		FROM ins WHERE run_id <> '' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
		ON CONFLICT (run_id, host, minute) DO UPDATE SET samples = m.samples + EXCLUDED.samples,
			mem_n = m.mem_n + EXCLUDED.mem_n, mem_sum = coalesce(m.mem_sum + EXCLUDED.mem_sum, m.mem_sum, EXCLUDED.mem_sum),
			mem_max = greatest(m.mem_max, EXCLUDED.mem_max), util_n = m.util_n + EXCLUDED.util_n,
			util_sum = coalesce(m.util_sum + EXCLUDED.util_sum, m.util_sum, EXCLUDED.util_sum),
			util_min = least(m.util_min, EXCLUDED.util_min),
			total_max = greatest(m.total_max, EXCLUDED.total_max)
	), h AS (
		INSERT INTO rank_hosts AS h (run_id, rank, host, time)
		SELECT DISTINCT ON (run_id, rank) run_id, rank, host, time FROM ins
		WHERE run_id <> '' AND rank IS NOT NULL ORDER BY run_id, rank, time DESC
		ON CONFLICT (run_id, rank) DO UPDATE SET host = EXCLUDED.host, time = EXCLUDED.time WHERE h.time <= EXCLUDED.time
	)
	SELECT count(*) FROM ins`

	mergeHost = `WITH ins AS (
		INSERT INTO host_samples SELECT * FROM tmp_host_samples ORDER BY host, time ON CONFLICT DO NOTHING
		RETURNING host, time, cpu_util_pct
	), m AS (
		INSERT INTO host_minutes AS m (host, minute, cpu_n, cpu_sum)
		SELECT host, date_trunc('minute', time), count(cpu_util_pct), sum(cpu_util_pct)
		FROM ins GROUP BY 1, 2 ORDER BY 1, 2
		ON CONFLICT (host, minute) DO UPDATE SET cpu_n = m.cpu_n + EXCLUDED.cpu_n,
			cpu_sum = coalesce(m.cpu_sum + EXCLUDED.cpu_sum, m.cpu_sum, EXCLUDED.cpu_sum)
	)
	SELECT count(*) FROM ins`

	// A resent breakdown without a time gets a new one; it only counts as
	// an update when its numbers differ.
	mergeMemory = `INSERT INTO memory_breakdowns AS m
		SELECT DISTINCT ON (run_id, rank) * FROM tmp_memory_breakdowns ORDER BY run_id, rank, time DESC
		ON CONFLICT (run_id, rank) DO UPDATE SET
			time = EXCLUDED.time,
			parameters_bytes = EXCLUDED.parameters_bytes,
			gradients_bytes = EXCLUDED.gradients_bytes,
			optimizer_bytes = EXCLUDED.optimizer_bytes,
			optimizer_device = EXCLUDED.optimizer_device,
			parameters_device = EXCLUDED.parameters_device,
			activations_bytes = EXCLUDED.activations_bytes
		WHERE m.time < EXCLUDED.time
		  AND (m.parameters_bytes, m.gradients_bytes, m.optimizer_bytes, m.optimizer_device, m.parameters_device, m.activations_bytes)
		      IS DISTINCT FROM (EXCLUDED.parameters_bytes, EXCLUDED.gradients_bytes, EXCLUDED.optimizer_bytes,
		      EXCLUDED.optimizer_device, EXCLUDED.parameters_device, EXCLUDED.activations_bytes)`

	mergeEvents = `INSERT INTO events SELECT * FROM tmp_events ORDER BY run_id, time, type, step, rank ON CONFLICT DO NOTHING`
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
			stmts = append(stmts, mergeStmt{kind: t.kind, sql: mergeGPU, count: true})
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
		// batch once per row: write_compressed.go.)
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
