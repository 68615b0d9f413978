package store

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Concurrency of a batch's writes. Every batch holds a shared lock on each
// run it writes to, which dropping a run (retention, DeleteRuns) takes
// exclusively, so a run is never dropped under a batch that writes to it.
// Keys are deduplicated per run and rank
// (per run and split for evaluations), so that is what a batch locks: an
// advisory lock per (run, rank) it brings steps or layers for, per (run,
// split) it brings evaluations for, and per run it brings events without
// a time for. The ranks of one run write in parallel; two batches of the
// same rank (a retry racing its original, a resumed run) wait for each
// other, so the probe for stored keys and the merge see each other's rows.
// Growing a run's layer names takes one more lock per run (layerLockKey),
// only in the batch that grows them, after the others.
//
// The runs row is written at the end of the transaction: run and end
// records, and last_seen_at and started_at when a record moves them,
// last_seen_at by a second or more, so that a steady stream of batches of a
// live run does not queue on its row.

// lockKey hashes the parts of a lock's name into PostgreSQL's advisory
// lock space. A collision makes two batches wait for each other, nothing
// worse.
func lockKey(parts ...string) int64 {
	h := fnv.New64a()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return int64(h.Sum64())
}

func runLockKey(run string) int64 { return lockKey(run, "run") }

// runLockKeys returns the shared run locks of the batch, sorted.
func (b *batchPlan) runLockKeys() []int64 {
	keys := make([]int64, len(b.runIDs))
	for i, id := range b.runIDs {
		keys[i] = runLockKey(id)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	return keys
}

func rankLockKey(run string, rank int) int64 { return lockKey(run, "rank", strconv.Itoa(rank)) }
func splitLockKey(run, split string) int64   { return lockKey(run, "split", split) }
func eventLockKey(run string) int64          { return lockKey(run, "events") }
func layerLockKey(run string) int64          { return lockKey(run, "layer_names") }

// lockKeys returns the advisory locks the batch takes, sorted and unique.
func (b *batchPlan) lockKeys() []int64 {
	set := map[int64]struct{}{}
	for _, s := range b.steps {
		set[rankLockKey(s.RunID, s.Rank)] = struct{}{}
	}
	for _, l := range b.layers {
		set[rankLockKey(l.RunID, l.Rank)] = struct{}{}
	}
	for _, e := range b.evals {
		set[splitLockKey(e.RunID, orDefault(e.Split, "val"))] = struct{}{}
	}
	for _, e := range b.untimed {
		set[eventLockKey(e.RunID)] = struct{}{}
	}
	keys := make([]int64, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	return keys
}

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
	if len(runs) == 0 {
		return nil
	}
	keys := make([]int64, len(runs))
	for i, id := range runs {
		keys[i] = layerLockKey(id)
	}
	q := &pgx.Batch{}
	q.Queue(`SELECT count(pg_advisory_xact_lock(k)) FROM (SELECT k FROM unnest($1::bigint[]) AS k ORDER BY k) AS l`, keys)
	q.Queue(`SELECT run_id, layer_names FROM runs WHERE run_id = ANY($1)`, runs).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var id string
			var names []string
			if err := rows.Scan(&id, &names); err != nil {
				return fmt.Errorf("read layer names: %w", err)
			}
			b.layerNames[id] = names
		}
		return rows.Err()
	})
	if err := tx.SendBatch(ctx, q).Close(); err != nil {
		return fmt.Errorf("store: write batch: lock layer names: %w", err)
	}
	return nil
}

// runUpdates queues the batch's writes to the runs table: the times its
// records move, then its run records, then its end records.
func (b *batchPlan) runUpdates(q *pgx.Batch) int {
	n := 0
	if len(b.runIDs) > 0 {
		first := make([]time.Time, len(b.runIDs))
		last := make([]time.Time, len(b.runIDs))
		for i, id := range b.runIDs {
			first[i], last[i] = b.runFirst[id], b.runLast[id]
		}
		q.Queue(`UPDATE runs AS r SET
				started_at = LEAST(r.started_at, u.first),
				last_seen_at = GREATEST(r.last_seen_at, u.last),
				updated_at = now()
			FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[]) AS u(run_id, first, last)
			WHERE r.run_id = u.run_id
			  AND (r.started_at IS NULL OR u.first < r.started_at
			       OR r.last_seen_at IS NULL OR u.last >= r.last_seen_at + interval '1 second'
			       OR r.updated_at < now() - interval '10 seconds')`,
			b.runIDs, first, last)
		n++
	}
	if len(b.runs) > 0 {
		var (
			ids                                        []string
			project, name, sweep, config, params, tags []*string
			meta, code                                 []*string
			started                                    []*time.Time
		)
		for id, u := range b.runs {
			ids = append(ids, id)
			project = append(project, u.project)
			name = append(name, u.name)
			sweep = append(sweep, u.sweepID)
			config = append(config, u.config)
			params = append(params, u.params)
			tags = append(tags, u.tags)
			code = append(code, u.code)
			started = append(started, u.startedAt)
			var m *string
			if u.meta != nil {
				js, _ := json.Marshal(u.meta)
				s := string(js)
				m = &s
			}
			meta = append(meta, m)
		}
		q.Queue(`UPDATE runs AS r SET
				project    = COALESCE(u.project, r.project),
				name       = COALESCE(u.name, r.name),
				sweep_id   = COALESCE(u.sweep_id, r.sweep_id),
				started_at = COALESCE(u.started_at, r.started_at),
				config     = COALESCE(u.config::jsonb, r.config),
				params     = COALESCE(u.params::jsonb, r.params),
				code       = COALESCE(u.code::jsonb, r.code),
				meta       = r.meta || COALESCE(u.meta::jsonb, '{}'),
				tags       = CASE WHEN u.tags IS NULL THEN r.tags
				                  ELSE ARRAY(SELECT jsonb_array_elements_text(u.tags::jsonb)) END,
				updated_at = now()
			FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[],
			            $6::text[], $7::text[], $8::text[], $9::text[], $10::text[])
			     AS u(run_id, project, name, sweep_id, started_at, config, params, meta, tags, code)
			WHERE r.run_id = u.run_id`,
			ids, project, name, sweep, started, config, params, meta, tags, code)
		n++
	}
	if len(b.ends) > 0 {
		var (
			ids, status []string
			at          []time.Time
			summary     []*string
		)
		for id, e := range b.ends {
			ids = append(ids, id)
			status = append(status, e.Status)
			at = append(at, e.Time.Time)
			summary = append(summary, rawObject(e.Summary))
		}
		q.Queue(`UPDATE runs AS r SET
				status = u.status,
				ended_at = u.ended_at,
				summary = r.summary || COALESCE(u.summary::jsonb, '{}'),
				updated_at = now()
			FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[]) AS u(run_id, status, ended_at, summary)
			WHERE r.run_id = u.run_id`, ids, status, at, summary)
		n++
	}
	return n
}

// mergeUntimedEvents inserts the events sent without a time that the run
// does not already hold with the same rank, step, type and text.
const mergeUntimedEvents = `INSERT INTO events
	SELECT s.* FROM (SELECT DISTINCT ON (run_id, rank, step, type, text) * FROM tmp_untimed_events
		ORDER BY run_id, rank, step, type, text, time) AS s
	WHERE NOT EXISTS (SELECT 1 FROM events AS t
		WHERE t.run_id = s.run_id AND t.rank = s.rank AND t.step = s.step AND t.type = s.type AND t.text = s.text)
	ORDER BY s.run_id, s.time, s.type, s.step, s.rank
	ON CONFLICT DO NOTHING`
