package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/deepseed/deepseed/api"
)

// WriteResult says what a batch changed.
type WriteResult struct {
	// Accepted counts records that were stored or that updated stored
	// data (runs, ends and ignored process records count here too).
	Accepted int
	// Duplicates counts records that changed nothing: already stored with
	// the same or a newer time, or repeated inside the batch.
	Duplicates int
	// ByKind counts accepted records by kind.
	ByKind map[string]int
}

// writeTimeout bounds a batch whose context has no deadline of its own.
const writeTimeout = 2 * time.Minute

// WriteBatch stores a validated batch in one transaction:
//
//   - Records without a time are stamped with [api.Now].
//   - A record for a run never announced creates the run (status running,
//     project "default"); every record moves the run's last_seen_at, and
//     started_at is the earliest record time unless a run record gives it.
//   - Run records update the run: fields present replace the stored ones,
//     meta is merged key by key. End records set status, ended_at and merge
//     summary.
//   - Steps, layers and evals are unique per run, rank (split for evals) and
//     step: one with a newer time replaces the stored row, one with the
//     same or an older time is a duplicate. GPU and host samples, events
//     and memory breakdowns dedupe on their keys; memory keeps the newest.
//   - Every step and layers row written marks its block of 100 steps in
//     rollup_dirty, in the same transaction.
//
// Rows go through COPY into temporary tables and are merged with one
// statement per table, never row by row. Advisory locks per run and rank
// (write_runs.go) keep concurrent batches from inserting the same key twice
// while the ranks of one run write in parallel.
// Errors for which [IsUnavailable] is true mean the batch may be retried.
func (s *Store) WriteBatch(ctx context.Context, recs []api.Record) (WriteResult, error) {
	return s.writeBatch(ctx, recs, writeCommit)
}

// CheckBatch writes a batch as WriteBatch would and rolls it back: it
// answers the error WriteBatch would, and stores nothing. Ingest uses it to
// find the record the database refuses in a batch it refused.
func (s *Store) CheckBatch(ctx context.Context, recs []api.Record) error {
	_, err := s.writeBatch(ctx, recs, writeCheck)
	return err
}

// writeMode is how writeBatch ends its transaction.
type writeMode int

const (
	writeCommit  writeMode = iota
	writeNewOnly           // roll back unless every key is new (WriteBatchNew)
	writeCheck             // always roll back (CheckBatch)
)

// ErrNotDirect is WriteBatchNew's answer for a batch some of whose keys
// are stored already, or repeated in it; nothing of it was written.
var ErrNotDirect = errors.New("store: batch holds keys that are stored already")

// WriteBatchNew writes a batch whose steps, layers and evaluations are all
// new, as WriteBatch would, and every record of it counts as accepted. A
// batch with a key that is stored or repeated is rolled back and answered
// with ErrNotDirect, for the caller to write through WriteBatch. Records
// other than runs, steps, layers and evaluations are not taken: their
// merges can find duplicates that this answer could not attribute.
func (s *Store) WriteBatchNew(ctx context.Context, recs []api.Record) (WriteResult, error) {
	for _, r := range recs {
		if r.Run == nil && r.Step == nil && r.Layers == nil && r.Eval == nil {
			return WriteResult{}, fmt.Errorf("store: write new batch: %s records are not taken", r.Kind())
		}
	}
	return s.writeBatch(ctx, recs, writeNewOnly)
}

func (s *Store) writeBatch(ctx context.Context, recs []api.Record, mode writeMode) (WriteResult, error) {
	res := WriteResult{ByKind: map[string]int{}}
	if len(recs) == 0 {
		return res, nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, writeTimeout)
		defer cancel()
	}
	b := newBatchPlan(recs, api.Now())
	b.rollback = mode == writeCheck
	b.timescale = s.Timescale

	// The transaction is driven by hand on a pooled connection rather
	// than through pgx.Tx, so that BEGIN travels with the first batch of
	// statements and COMMIT with the last: two round trips fewer per batch,
	// which under load is two waits fewer for the database's turn on a CPU.
	conn, err := s.Pool.Acquire(ctx)
	if err != nil {
		return res, fmt.Errorf("store: write batch: begin: %w", err)
	}
	defer func() {
		// A connection left inside a transaction (a statement failed, or
		// COMMIT was never reached) is rolled back with a fresh context, so
		// that a cancelled request still releases it cleanly; the pool
		// closes one that is still not idle.
		if conn.Conn().PgConn().TxStatus() != 'I' && !conn.Conn().IsClosed() {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, _ = conn.Exec(rctx, "ROLLBACK")
			cancel()
		}
		conn.Release()
	}()

	if err := b.prepare(ctx, conn); err != nil {
		return res, err
	}
	if mode == writeNewOnly && !b.allDirect() {
		// The deferred ROLLBACK undoes what prepare did.
		return res, ErrNotDirect
	}
	if err := b.copy(ctx, conn); err != nil {
		return res, err
	}
	if b.timescale {
		if err := b.probeStale(ctx, conn); err != nil {
			return res, err
		}
	}
	written, err := b.merge(ctx, conn)
	if err != nil {
		return res, err
	}

	for kind, n := range b.counts {
		w, merged := written[kind]
		if !merged {
			w = n
		}
		res.ByKind[kind] = w
		res.Accepted += w
		res.Duplicates += n - w
	}
	return res, nil
}

// batchConn is the connection a batch is written on, inside the
// transaction that prepare opens and merge commits.
type batchConn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error)
}

// batchPlan is a batch sorted by table, with the run bookkeeping worked out.
type batchPlan struct {
	now    time.Time
	counts map[string]int // records by kind

	steps  []*api.Step
	layers []*api.Layers
	evals  []*api.Eval
	gpus   []*api.GPU
	hosts  []*api.Host
	mems   []*api.Memory
	events []*api.Event
	// untimed are events sent without a time: they are stamped with the
	// batch's time, so a retry would carry a new one, and they dedupe on
	// their content instead (run, rank, step, type and text).
	untimed []*api.Event

	runIDs   []string // every run the batch touches, sorted
	runFirst map[string]time.Time
	runLast  map[string]time.Time
	runs     map[string]*runUpdate // merged run records
	ends     map[string]*api.End   // last end record per run

	// layerNames holds runs.layer_names of the runs with layers records,
	// read under the run lock and extended by this batch.
	layerNames map[string][]string
	layerGrown map[string]bool
	layerIdx   map[string]map[string][]int // run → name → positions

	// direct holds the kinds (step, layers, eval) whose rows are COPYed
	// straight into their tables: the batch repeats none of their keys and
	// the table holds none of them, checked under the run locks. That is
	// every batch of a live run, whose steps are all new; the temporary
	// table, the dedupe probes and the merge are needed only for retries
	// and resumed runs.
	direct map[string]bool
	// inlined is set when the steps went in with prepare's round trip
	// (inlineSteps) and need no COPY.
	inlined bool
	// timescale is set on TimescaleDB, where the steps, layers and evals
	// that go through a temporary table merge segment by segment (segs,
	// write_compressed.go).
	timescale bool
	segs      map[string][]*segment
	// rollback ends the transaction with ROLLBACK instead of COMMIT.
	rollback bool
}

type runUpdate struct {
	project, name, sweepID *string
	startedAt              *time.Time
	config, params, tags   *string
	code                   *string
	meta                   map[string]json.RawMessage
}

func newBatchPlan(recs []api.Record, now time.Time) *batchPlan {
	b := &batchPlan{
		now:      now,
		counts:   map[string]int{},
		runFirst: map[string]time.Time{},
		runLast:  map[string]time.Time{},
		runs:     map[string]*runUpdate{},
		ends:     map[string]*api.End{},
	}
	stamp := func(t **api.Time) time.Time {
		if *t == nil || (*t).IsZero() {
			*t = api.T(now)
		}
		return (*t).Time
	}
	for _, r := range recs {
		b.counts[r.Kind()]++
		switch {
		case r.Run != nil:
			b.run(r.Run)
		case r.Step != nil:
			b.seen(r.Step.RunID, stamp(&r.Step.Time))
			b.steps = append(b.steps, r.Step)
		case r.Layers != nil:
			b.seen(r.Layers.RunID, stamp(&r.Layers.Time))
			b.layers = append(b.layers, r.Layers)
		case r.Eval != nil:
			b.seen(r.Eval.RunID, stamp(&r.Eval.Time))
			b.evals = append(b.evals, r.Eval)
		case r.GPU != nil:
			stamp(&r.GPU.Time)
			b.gpus = append(b.gpus, r.GPU)
		case r.Host != nil:
			stamp(&r.Host.Time)
			b.hosts = append(b.hosts, r.Host)
		case r.Memory != nil:
			b.seen(r.Memory.RunID, stamp(&r.Memory.Time))
			b.mems = append(b.mems, r.Memory)
		case r.Event != nil:
			if r.Event.Time == nil || r.Event.Time.IsZero() {
				b.untimed = append(b.untimed, r.Event)
			} else {
				b.events = append(b.events, r.Event)
			}
			b.seen(r.Event.RunID, stamp(&r.Event.Time))
		case r.End != nil:
			b.seen(r.End.RunID, stamp(&r.End.Time))
			b.ends[r.End.RunID] = r.End
		}
	}
	for id := range b.runFirst {
		b.runIDs = append(b.runIDs, id)
	}
	sort.Strings(b.runIDs)
	return b
}

func (b *batchPlan) seen(runID string, t time.Time) {
	if f, ok := b.runFirst[runID]; !ok || t.Before(f) {
		b.runFirst[runID] = t
	}
	if l, ok := b.runLast[runID]; !ok || t.After(l) {
		b.runLast[runID] = t
	}
}

// run folds a run record into the batch's update of that run, so that
// several records for one run in a batch apply in order.
func (b *batchPlan) run(r *api.Run) {
	t := b.now
	if r.StartedAt != nil && !r.StartedAt.IsZero() {
		t = r.StartedAt.Time
	}
	b.seen(r.RunID, t)
	u := b.runs[r.RunID]
	if u == nil {
		u = &runUpdate{}
		b.runs[r.RunID] = u
	}
	if r.Project != "" {
		u.project = &r.Project
	}
	if r.Name != "" {
		u.name = &r.Name
	}
	if r.SweepID != "" {
		u.sweepID = &r.SweepID
	}
	if r.StartedAt != nil && !r.StartedAt.IsZero() {
		st := r.StartedAt.Time
		u.startedAt = &st
	}
	if js := rawObject(r.Config); js != nil {
		u.config = js
	}
	if js := rawObject(r.Params); js != nil {
		u.params = js
	}
	if r.Code != nil {
		if js, err := json.Marshal(r.Code); err == nil {
			s := string(js)
			u.code = &s
		}
	}
	if r.Tags != nil {
		js, _ := json.Marshal(r.Tags)
		s := string(js)
		u.tags = &s
	}
	if r.Meta != nil {
		js, err := json.Marshal(r.Meta)
		var m map[string]json.RawMessage
		if err == nil && json.Unmarshal(js, &m) == nil {
			if u.meta == nil {
				u.meta = map[string]json.RawMessage{}
			}
			for k, v := range m {
				u.meta[k] = v
			}
		}
	}
}

func rawObject(raw json.RawMessage) *string {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	s := string(raw)
	return &s
}

// prepare begins the transaction, takes the batch's key locks, creates the
// runs it names, probes for stored keys and reads the layer names of runs
// with layers records, in one round trip, and creates the temporary tables
// a batch with stored keys needs. Run and end records, and the runs'
// last-seen times, are applied at the end of the transaction (see
// runUpdates), so that the runs row is locked for as short a time as
// possible.
func (b *batchPlan) prepare(ctx context.Context, tx batchConn) error {
	q := &pgx.Batch{}
	q.Queue(`BEGIN`)
	if keys := b.runLockKeys(); len(keys) > 0 {
		q.Queue(`SELECT count(pg_advisory_xact_lock_shared(k)) FROM (SELECT k FROM unnest($1::bigint[]) AS k ORDER BY k) AS l`, keys)
	}
	if keys := b.lockKeys(); len(keys) > 0 {
		// Locks are taken in key order so that batches cannot deadlock
		// each other over them.
		q.Queue(`SELECT count(pg_advisory_xact_lock(k)) FROM (SELECT k FROM unnest($1::bigint[]) AS k ORDER BY k) AS l`, keys)
	}
	if len(b.runIDs) > 0 {
		// A new run is created here; an existing one is only moved by
		// runUpdates, and only when its times change, so the ranks of a
		// live run do not queue on its row.
		first := make([]time.Time, len(b.runIDs))
		last := make([]time.Time, len(b.runIDs))
		for i, id := range b.runIDs {
			first[i], last[i] = b.runFirst[id], b.runLast[id]
		}
		q.Queue(`INSERT INTO runs (run_id, started_at, last_seen_at)
			SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[])
			ON CONFLICT (run_id) DO NOTHING`, b.runIDs, first, last)
	}
	// Probe for stored keys once per run and rank (or split), over the
	// range of steps the batch brings, instead of once per row in the
	// merge. Each probe is a LATERAL subquery with LIMIT 1, which the
	// planner can only run as an index probe per range, never as a hash of
	// the table.
	checks := b.directChecks()
	b.direct = map[string]bool{}
	for _, c := range checks {
		if c.kind == api.KindStep && len(b.steps) <= inlineMaxSteps {
			b.inlineSteps(q, c)
			continue
		}
		q.Queue(c.sql, c.args...).QueryRow(func(row pgx.Row) error {
			var stored bool
			if err := row.Scan(&stored); err != nil {
				return fmt.Errorf("check stored %s keys: %w", c.kind, err)
			}
			b.direct[c.kind] = !stored
			return nil
		})
	}
	if len(b.layers) > 0 {
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
		q.Queue(`SELECT run_id, layer_names FROM runs WHERE run_id = ANY($1)`, layerRuns).Query(func(rows pgx.Rows) error {
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
	if err := tx.SendBatch(ctx, q).Close(); err != nil {
		return fmt.Errorf("store: write batch: prepare runs: %w", err)
	}
	if err := b.lockLayerNames(ctx, tx); err != nil {
		return err
	}

	// Each connection keeps its temporary tables and they empty themselves
	// at commit. Creating and dropping them per batch would write the
	// system catalogs and broadcast invalidations to every backend each
	// time, which costs more than the rows themselves under load.
	q = &pgx.Batch{}
	for _, t := range b.tables() {
		if t.temp != t.target {
			q.Queue(`CREATE TEMP TABLE IF NOT EXISTS ` + t.temp + ` (LIKE ` + t.target + `) ON COMMIT DELETE ROWS`)
		}
	}
	if q.Len() > 0 {
		if err := tx.SendBatch(ctx, q).Close(); err != nil {
			return fmt.Errorf("store: write batch: create temporary tables: %w", err)
		}
	}
	return nil
}

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

// copyTable is one table the batch writes through a temporary table.
type copyTable struct {
	kind   string
	temp   string
	target string
	cols   []string
	n      int
	row    func(i int, dst []any) []any
}

// tables lists the tables the batch writes. A table whose rows go in
// directly has its target as its temp.
func (b *batchPlan) tables() []copyTable {
	var ts []copyTable
	temp := func(kind, name, target string) string {
		if b.direct[kind] {
			return target
		}
		return name
	}
	if len(b.steps) > 0 {
		ts = append(ts, copyTable{api.KindStep, temp(api.KindStep, "tmp_steps", "steps"), "steps", stepCols, len(b.steps), b.stepRow})
	}
	if len(b.layers) > 0 {
		ts = append(ts, copyTable{api.KindLayers, temp(api.KindLayers, "tmp_layer_times", "layer_times"), "layer_times", layerCols, len(b.layers), b.layerRow})
	}
	if len(b.evals) > 0 {
		ts = append(ts, copyTable{api.KindEval, temp(api.KindEval, "tmp_evals", "evals"), "evals", evalCols, len(b.evals), b.evalRow})
	}
	if len(b.gpus) > 0 {
		ts = append(ts, copyTable{api.KindGPU, "tmp_gpu_samples", "gpu_samples", gpuCols, len(b.gpus), b.gpuRow})
	}
	if len(b.hosts) > 0 {
		ts = append(ts, copyTable{api.KindHost, "tmp_host_samples", "host_samples", hostCols, len(b.hosts), b.hostRow})
	}
	if len(b.mems) > 0 {
		ts = append(ts, copyTable{api.KindMemory, "tmp_memory_breakdowns", "memory_breakdowns", memCols, len(b.mems), b.memRow})
	}
	if len(b.events) > 0 {
		ts = append(ts, copyTable{api.KindEvent, "tmp_events", "events", eventCols, len(b.events), b.eventRow})
	}
	if len(b.untimed) > 0 {
		ts = append(ts, copyTable{api.KindEvent, "tmp_untimed_events", "events", eventCols, len(b.untimed), b.untimedRow})
	}
	return ts
}

// copy sends every record into its temporary table with COPY.
func (b *batchPlan) copy(ctx context.Context, tx batchConn) error {
	if len(b.layers) > 0 {
		b.alignLayers()
	}
	for _, t := range b.tables() {
		if t.kind == api.KindStep && b.inlined {
			continue
		}
		buf := make([]any, 0, len(t.cols))
		src := pgx.CopyFromSlice(t.n, func(i int) ([]any, error) {
			// pgx encodes a row before asking for the next, so one
			// buffer serves every row.
			return t.row(i, buf[:0]), nil
		})
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{t.temp}, t.cols, src); err != nil {
			return fmt.Errorf("store: write batch: copy %s: %w", t.target, err)
		}
	}
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
	mergeGPU = `INSERT INTO gpu_samples SELECT * FROM tmp_gpu_samples ORDER BY host, gpu, time ON CONFLICT DO NOTHING`

	mergeHost = `INSERT INTO host_samples SELECT * FROM tmp_host_samples ORDER BY host, time ON CONFLICT DO NOTHING`

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
			stmts = append(stmts, mergeStmt{kind: t.kind, sql: mergeGPU})
		case api.KindHost:
			stmts = append(stmts, mergeStmt{kind: t.kind, sql: mergeHost})
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

var (
	stepCols = []string{"run_id", "rank", "step", "time", "epoch", "loss", "lr", "grad_norm", "loss_scale", "skipped",
		"samples", "tokens", "throughput_sps", "throughput_tps", "step_ms", "forward_ms", "backward_ms", "optimizer_ms",
		"comm_ms", "data_ms", "gpu_util_pct", "gpu_mem_used_gb", "gpu_mem_peak_gb", "gpu_mem_reserved_gb", "cpu_util_pct", "tflops", "mfu", "metrics"}
	layerCols = []string{"run_id", "rank", "step", "time", "forward_ms", "backward_ms"}
	evalCols  = []string{"run_id", "step", "time", "split", "loss", "accuracy", "f1", "metrics"}
	gpuCols   = []string{"time", "host", "gpu", "uuid", "name", "run_id", "rank", "util_pct", "mem_util_pct",
		"mem_used_bytes", "mem_total_bytes", "mem_reserved_bytes", "power_w", "energy_j", "temp_c", "mem_temp_c",
		"sm_clock_mhz", "mem_clock_mhz", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "pcie_replay_total",
		"nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s", "xid_last", "xid_total", "ecc_corrected_total",
		"ecc_uncorrected_total", "remapped_rows_total", "throttle_reasons", "sm_active_pct", "sm_occupancy_pct",
		"tensor_active_pct", "gr_engine_active_pct", "processes"}
	hostCols = []string{"time", "host", "cpu_util_pct", "mem_used_bytes", "mem_total_bytes", "load1", "processes"}
	memCols  = []string{"run_id", "rank", "time", "parameters_bytes", "gradients_bytes", "optimizer_bytes",
		"optimizer_device", "parameters_device", "activations_bytes"}
	eventCols = []string{"run_id", "time", "step", "rank", "type", "text"}
)

// f turns an optional number into a COPY value; NaN and the infinities
// pass through as float8 NaN and ±Infinity.
func f(p *api.Float) any {
	if p == nil {
		return nil
	}
	return float64(*p)
}

func optInt[T int | int64](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// jsonValue encodes v for a jsonb column; empty maps and slices are NULL.
func jsonValue[T any](v T, empty bool) any {
	if empty {
		return nil
	}
	js, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	return string(js)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func (b *batchPlan) stepRow(i int, r []any) []any {
	s := b.steps[i]
	var skipped any
	if s.Skipped != nil {
		skipped = *s.Skipped
	}
	return append(r, s.RunID, int32(s.Rank), *s.Step, s.Time.Time, f(s.Epoch), f(s.Loss), f(s.LR), f(s.GradNorm),
		f(s.LossScale), skipped, optInt(s.Samples), optInt(s.Tokens), f(s.ThroughputSPS), f(s.ThroughputTPS),
		f(s.StepMS), f(s.ForwardMS), f(s.BackwardMS), f(s.OptimizerMS), f(s.CommMS), f(s.DataMS), f(s.GPUUtilPct),
		f(s.GPUMemUsedGB), f(s.GPUMemPeakGB), f(s.GPUMemResvGB), f(s.CPUUtilPct), f(s.TFLOPS), f(s.MFU),
		jsonValue(s.Metrics, len(s.Metrics) == 0))
}

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

func (b *batchPlan) evalRow(i int, r []any) []any {
	e := b.evals[i]
	return append(r, e.RunID, *e.Step, e.Time.Time, orDefault(e.Split, "val"), f(e.Loss), f(e.Accuracy), f(e.F1),
		jsonValue(e.Metrics, len(e.Metrics) == 0))
}

func (b *batchPlan) gpuRow(i int, r []any) []any {
	g := b.gpus[i]
	var rank any
	if g.Rank != nil {
		rank = int32(*g.Rank)
	}
	return append(r, g.Time.Time, g.Host, int32(*g.GPU), g.UUID, g.Name, g.RunID, rank, f(g.UtilPct), f(g.MemUtilPct),
		f(g.MemUsedBytes), f(g.MemTotalBytes), f(g.MemReservedBytes), f(g.PowerW), f(g.EnergyJ), f(g.TempC),
		f(g.MemTempC), f(g.SMClockMHz), f(g.MemClockMHz), f(g.PCIeTxBps), f(g.PCIeRxBps), f(g.PCIeReplays),
		f(g.NVLinkTxBps), f(g.NVLinkRxBps), f(g.XIDLast), f(g.XIDTotal), f(g.ECCCorrected), f(g.ECCUncorrected),
		f(g.RemappedRows), optInt(g.ThrottleReasons), f(g.SMActivePct), f(g.SMOccupancyPct), f(g.TensorActivePct),
		f(g.GrEngineActivePct), jsonValue(g.Processes, len(g.Processes) == 0))
}

func (b *batchPlan) hostRow(i int, r []any) []any {
	h := b.hosts[i]
	return append(r, h.Time.Time, h.Host, f(h.CPUUtilPct), f(h.MemUsedBytes), f(h.MemTotalBytes), f(h.Load1),
		jsonValue(h.Processes, len(h.Processes) == 0))
}

func (b *batchPlan) memRow(i int, r []any) []any {
	m := b.mems[i]
	return append(r, m.RunID, int32(m.Rank), m.Time.Time, f(m.ParametersBytes), f(m.GradientsBytes),
		f(m.OptimizerBytes), orDefault(m.OptimizerDevice, "gpu"), orDefault(m.ParametersDevice, "gpu"),
		f(m.ActivationsBytes))
}

func (b *batchPlan) eventRow(i int, r []any) []any { return eventRow(b.events[i], r) }

func (b *batchPlan) untimedRow(i int, r []any) []any { return eventRow(b.untimed[i], r) }

func eventRow(e *api.Event, r []any) []any {
	step, rank := int64(-1), int32(-1)
	if e.Step != nil {
		step = *e.Step
	}
	if e.Rank != nil {
		rank = int32(*e.Rank)
	}
	return append(r, e.RunID, e.Time.Time, step, rank, e.Type, e.Text)
}

// RunStartedAt returns the stored start of a run, and whether the run
// exists with a start.
func (s *Store) RunStartedAt(ctx context.Context, runID string) (time.Time, bool, error) {
	var t *time.Time
	err := s.Pool.QueryRow(ctx, `SELECT started_at FROM runs WHERE run_id = $1`, runID).Scan(&t)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("store: read run %s: %w", runID, err)
	}
	if t == nil {
		return time.Time{}, false, nil
	}
	return t.UTC(), true, nil
}

// RunProject returns the project run runID is stored in; found is false
// when there is no such run.
func (s *Store) RunProject(ctx context.Context, runID string) (project string, found bool, err error) {
	err = s.Pool.QueryRow(ctx, `SELECT project FROM runs WHERE run_id = $1`, runID).Scan(&project)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("store: read run %s: %w", runID, err)
	}
	return project, true, nil
}

// CopyRaw writes steps, layers and evals straight into their tables with
// COPY, in one transaction: no temporary tables, no dedupe, no run
// bookkeeping. It is the baseline the ingest benchmark compares the real
// write path with; a run's layers must all list the same names in the same
// order. Use it on scratch runs only: it stores a retried batch twice.
func (s *Store) CopyRaw(ctx context.Context, recs []api.Record) error {
	b := newBatchPlan(recs, api.Now())
	b.layerNames = map[string][]string{}
	b.layerIdx = map[string]map[string][]int{}
	for _, l := range b.layers {
		if _, ok := b.layerNames[l.RunID]; !ok {
			b.layerNames[l.RunID] = l.Names
			pos := map[string][]int{}
			for i, n := range l.Names {
				pos[n] = append(pos[n], i)
			}
			b.layerIdx[l.RunID] = pos
		}
	}
	return pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		for _, t := range b.tables() {
			switch t.kind {
			case api.KindStep, api.KindLayers, api.KindEval:
			default:
				continue
			}
			buf := make([]any, 0, len(t.cols))
			src := pgx.CopyFromSlice(t.n, func(i int) ([]any, error) { return t.row(i, buf[:0]), nil })
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{t.target}, t.cols, src); err != nil {
				return fmt.Errorf("store: raw copy %s: %w", t.target, err)
			}
		}
		return nil
	})
}

// DeleteRuns removes runs and every row that belongs to them. Load tools
// use it to clear their scratch runs.
func (s *Store) DeleteRuns(ctx context.Context, runIDs []string) error {
	return pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		// The runs' locks, which batches hold shared, then the rollup
		// refresher's, each in key order: a refresh of one of these runs
		// deletes its markers and writes its rollups, the other way round
		// from here, and the two would deadlock.
		keys := make([]int64, len(runIDs))
		for i, id := range runIDs {
			keys[i] = runLockKey(id)
		}
		if _, err := tx.Exec(ctx, `SELECT count(pg_advisory_xact_lock(k)) FROM
			(SELECT DISTINCT k FROM unnest($1::bigint[]) AS k ORDER BY 1) AS l`, keys); err != nil {
			return fmt.Errorf("store: delete runs: lock runs: %w", err)
		}
		if _, err := tx.Exec(ctx, `SELECT count(pg_advisory_xact_lock(k)) FROM
			(SELECT DISTINCT hashtextextended('rollup:' || r, 0) AS k FROM unnest($1::text[]) AS r ORDER BY 1) AS l`, runIDs); err != nil {
			return fmt.Errorf("store: delete runs: lock rollups: %w", err)
		}
		for _, t := range []string{"steps", "layer_times", "evals", "memory_breakdowns", "events", "rollup_dirty", "metric_rollups", "layer_rollups", "runs"} {
			if _, err := tx.Exec(ctx, `DELETE FROM `+t+` WHERE run_id = ANY($1)`, runIDs); err != nil {
				return fmt.Errorf("store: delete runs from %s: %w", t, err)
			}
		}
		return nil
	})
}
