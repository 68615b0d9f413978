package store

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
// (batch_locks.go) keep concurrent batches from inserting the same key twice
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
	recs = api.ExpandSteps(recs)
	for _, r := range recs {
		if r.Run == nil && r.Step == nil && r.Layers == nil && r.Eval == nil {
			return WriteResult{}, fmt.Errorf("store: write new batch: %s records are not taken", r.Kind())
		}
	}
	return s.writeBatch(ctx, recs, writeNewOnly)
}

func (s *Store) writeBatch(ctx context.Context, recs []api.Record, mode writeMode) (WriteResult, error) {
	// A steps record is written as the step records it holds.
	recs = api.ExpandSteps(recs)
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
	conn, err := s.pool.Acquire(ctx)
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
	// that go through a temporary table merge segment by segment (groups,
	// batch_compressed.go).
	timescale bool
	groups    map[string][]*segGroup
	// rollback ends the transaction with ROLLBACK instead of COMMIT.
	rollback bool
	// wide is set when the batch holds wideBatchLock exclusively in place
	// of its runs', ranks' and hosts' locks (batch_locks.go).
	wide bool
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
	shared, exclusive := b.runLockKeys(), b.lockKeys()
	if b.wide = wideBatch(shared, exclusive); b.wide {
		q.Queue(`SELECT pg_advisory_xact_lock($1)`, wideBatchLock)
	} else {
		q.Queue(`SELECT pg_advisory_xact_lock_shared($1)`, wideBatchLock)
		if len(shared) > 0 {
			q.Queue(`SELECT count(pg_advisory_xact_lock_shared(k)) FROM (SELECT k FROM unnest($1::bigint[]) AS k ORDER BY k) AS l`, shared)
		}
		if len(exclusive) > 0 {
			// Locks are taken in key order so that batches cannot deadlock
			// each other over them.
			q.Queue(`SELECT count(pg_advisory_xact_lock(k)) FROM (SELECT k FROM unnest($1::bigint[]) AS k ORDER BY k) AS l`, exclusive)
		}
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
	b.queueLayerNames(q)
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
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
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
