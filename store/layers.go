package store

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The layer_times table: one row per rank and step, its per-layer forward
// and backward times as float8 arrays indexed by the run's layer_names,
// which only ever grow. This file holds how a batch places a layers record
// in the run's names (under the layer-names lock when it adds names), its
// COPY row and merge statement, and the raw reads; layers_rollup.go folds
// the rows into layer_rollups. The batch mechanism they plug into is
// batch*.go.

// layerCols are the columns of layer_times a batch writes, in COPY order.
var layerCols = []string{"run_id", "rank", "step", "time", "forward_ms", "backward_ms"}

// queueLayerNames queues, in prepare's round trip, the read of the layer
// names of the runs the batch has layers records for.
func (b *batchPlan) queueLayerNames(q *pgx.Batch) {
	if len(b.layers) == 0 {
		return
	}
	var layerRuns []string
	set := map[string]bool{}
	for _, l := range b.layers {
		if !set[l.RunID] {
			set[l.RunID] = true
			layerRuns = append(layerRuns, l.RunID)
		}
	}
	b.layerNames = map[string][]string{}
	b.layerGrown = map[string]bool{}
	b.readLayerNames(q, layerRuns)
}

// readLayerNames queues the read of runs.layer_names of runs into
// b.layerNames: in prepare without a lock, and again under the layer-names
// lock in lockLayerNames for the runs the batch grows.
func (b *batchPlan) readLayerNames(q *pgx.Batch, runs []string) {
	q.Queue(`SELECT run_id, layer_names FROM runs WHERE run_id = ANY($1)`, runs).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var id string
			var names []string
			if err := rows.Scan(&id, &names); err != nil {
				return fmt.Errorf("read layer names: %w", err)
			}
			b.layerNames[id] = names
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read layer names: %w", err)
		}
		return nil
	})
}

func layerLockKey(run string) int64 { return lockKey(run, "layer_names") }

// growingLayerRuns returns the runs whose layer names this batch extends,
// judged against the names read in prepare, sorted.
func (b *batchPlan) growingLayerRuns() []string {
	var runs []string
	seen := map[string]bool{}
	for _, l := range b.layers {
		if seen[l.RunID] {
			continue
		}
		names := b.layerNames[l.RunID]
		if namesPrefix(l.Names, names) {
			continue
		}
		count := map[string]int{}
		for _, n := range names {
			count[n]++
		}
		grows := false
		for _, n := range l.Names {
			if count[n] == 0 {
				grows = true
				break
			}
			count[n]--
		}
		if grows {
			seen[l.RunID] = true
			runs = append(runs, l.RunID)
		}
	}
	sort.Strings(runs)
	return runs
}

// lockLayerNames takes the layer-names lock of the runs this batch grows
// and reads their names again under it: names only ever grow, so a batch
// that finds all its names already stored can place its layers without the
// lock, and one that adds names must add them to the newest list.
func (b *batchPlan) lockLayerNames(ctx context.Context, tx batchConn) error {
	runs := b.growingLayerRuns()
	if len(runs) == 0 || b.wide {
		// A wide batch writes alone: the names prepare read are the newest.
		return nil
	}
	keys := make([]int64, len(runs))
	for i, id := range runs {
		keys[i] = layerLockKey(id)
	}
	q := &pgx.Batch{}
	q.Queue(`SELECT count(pg_advisory_xact_lock(k)) FROM (SELECT k FROM unnest($1::bigint[]) AS k ORDER BY k) AS l`, keys)
	b.readLayerNames(q, runs)
	if err := tx.SendBatch(ctx, q).Close(); err != nil {
		return fmt.Errorf("store: write batch: lock layer names: %w", err)
	}
	return nil
}

// alignLayers extends each run's layer names with the names it has not
// seen, in the order they arrive. A name that occurs k times in a record
// maps to its k-th occurrence in the run's names, so models that repeat a
// module name keep every instance apart.
func (b *batchPlan) alignLayers() {
	idx := map[string]map[string][]int{}
	for _, l := range b.layers {
		names := b.layerNames[l.RunID]
		pos := idx[l.RunID]
		if pos == nil {
			pos = map[string][]int{}
			for i, n := range names {
				pos[n] = append(pos[n], i)
			}
			idx[l.RunID] = pos
		}
		if namesPrefix(l.Names, names) {
			// The common case: a record lists the run's layers in order.
			continue
		}
		seen := map[string]int{}
		for _, n := range l.Names {
			k := seen[n]
			seen[n] = k + 1
			if k >= len(pos[n]) {
				pos[n] = append(pos[n], len(names))
				names = append(names, n)
				b.layerGrown[l.RunID] = true
			}
		}
		b.layerNames[l.RunID] = names
	}
	b.layerIdx = idx
}

// namesPrefix reports whether names starts with rec. Then the k-th
// occurrence of a name in rec is also its k-th occurrence in names, so the
// record's layers sit at their own positions.
func namesPrefix(rec, names []string) bool {
	if len(rec) > len(names) {
		return false
	}
	for i, n := range rec {
		if names[i] != n {
			return false
		}
	}
	return true
}

// saveLayerNames stores the layer names that alignLayers extended.
func (b *batchPlan) saveLayerNames(ctx context.Context, tx batchConn) error {
	if len(b.layerGrown) > 0 {
		var ids, names []string
		for id := range b.layerGrown {
			js, _ := json.Marshal(b.layerNames[id])
			ids = append(ids, id)
			names = append(names, string(js))
		}
		if _, err := tx.Exec(ctx, `UPDATE runs AS r
			SET layer_names = ARRAY(SELECT jsonb_array_elements_text(u.names::jsonb)), updated_at = now()
			FROM unnest($1::text[], $2::text[]) AS u(run_id, names)
			WHERE r.run_id = u.run_id`, ids, names); err != nil {
			return fmt.Errorf("store: write batch: update layer names: %w", err)
		}
	}
	return nil
}

// layerRow is the COPY row of the batch's i-th layers record, each time
// at its layer's position in the run's names.
func (b *batchPlan) layerRow(i int, r []any) []any {
	l := b.layers[i]
	pos := b.layerIdx[l.RunID]
	width := len(b.layerNames[l.RunID])
	fwd := make([]pgtype.Float8, width)
	var bwd []pgtype.Float8
	if len(l.BackwardMS) > 0 {
		bwd = make([]pgtype.Float8, width)
	}
	// A record whose names start the run's list keeps its own positions
	// (alignLayers says why); any other finds each name's position, the
	// k-th occurrence of a repeated name taking the k-th position.
	own := namesPrefix(l.Names, b.layerNames[l.RunID])
	var seen map[string]int
	if !own {
		seen = make(map[string]int, len(l.Names))
	}
	for j, n := range l.Names {
		at := j
		if !own {
			k := seen[n]
			seen[n] = k + 1
			at = pos[n][k]
		}
		fwd[at] = pgtype.Float8{Float64: float64(l.ForwardMS[j]), Valid: true}
		if bwd != nil {
			bwd[at] = pgtype.Float8{Float64: float64(l.BackwardMS[j]), Valid: true}
		}
	}
	var bw any
	if bwd != nil {
		bw = bwd
	}
	return append(r, l.RunID, int32(l.Rank), *l.Step, l.Time.Time, fwd, bw)
}

// mergeLayers is the merge of layer_times, keyed and marked as steps'.
var mergeLayers = mergeNewest("layer_times", "rank", true)

// LayerRow is one step's per-layer timings, or a rollup bucket's per-layer
// sums and counts (Counts nil for a raw row: each value counts once).
type LayerRow struct {
	Step      int64 // raw: the step; rollup: the bucket's first step
	Bucket    int64 // rollup only
	Time      time.Time
	Sums      []*float64
	Counts    []int64
	BwdSums   []*float64
	BwdCounts []int64
}

// LayersRaw returns raw per-layer rows of one rank over [from, to].
func (s *Store) LayersRaw(ctx context.Context, runID string, rank int, from, to int64, backward bool) ([]LayerRow, error) {
	col := "forward_ms"
	if backward {
		col = "backward_ms"
	}
	rows, err := s.pool.Query(ctx, `SELECT step, time, coalesce(`+col+`, '{}') FROM layer_times
		WHERE run_id = $1 AND rank = $2 AND step >= $3 AND step <= $4 ORDER BY step`, runID, rank, from, to)
	if err != nil {
		return nil, fmt.Errorf("store: read layers of %s: %w", runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LayerRow, error) {
		var p LayerRow
		err := r.Scan(&p.Step, &p.Time, &p.Sums)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: read layers of %s: %w", runID, err)
	}
	return out, nil
}

// LayerRollups returns layer rollup buckets of width w in [fromBucket,
// toBucket], with the sums and counts of one pass.
func (s *Store) LayerRollups(ctx context.Context, runID string, rank int, w, fromBucket, toBucket int64, backward bool) ([]LayerRow, error) {
	cols := "fwd_sums, " + layerCountsSQL("", "fwd")
	if backward {
		cols = "bwd_sums, " + layerCountsSQL("", "bwd")
	}
	rows, err := s.pool.Query(ctx, `SELECT bucket, first_step, first_time, `+cols+` FROM layer_rollups
		WHERE run_id = $1 AND rank = $2 AND width = $3 AND bucket >= $4 AND bucket <= $5 ORDER BY bucket`,
		runID, rank, w, fromBucket, toBucket)
	if err != nil {
		return nil, fmt.Errorf("store: read layer rollups of %s: %w", runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LayerRow, error) {
		var p LayerRow
		err := r.Scan(&p.Bucket, &p.Step, &p.Time, &p.Sums, &p.Counts)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: read layer rollups of %s: %w", runID, err)
	}
	return out, nil
}

// LayerSpan returns the first and last step with layer timings of a rank.
func (s *Store) LayerSpan(ctx context.Context, runID string, rank int) (first, last int64, ok bool, err error) {
	return s.span(ctx, "layer_times", runID, rank)
}
