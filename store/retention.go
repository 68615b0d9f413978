package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Retention rule (docs/retention.md):
//
//   - A run is kept whole while its last activity is within the horizon,
//     and dropped whole once it is older: its rows in every table, its
//     rollups, its summary and its runs row. A run's last activity is
//     runs.updated_at, the time the server last received anything for it
//     (every write of a run moves it; reads do not). So an imported run
//     counts from its import, whatever the times inside it, and a run that
//     trained longer than the horizon keeps its first steps while it is
//     written to.
//   - GPU samples attributed to a run that exists go with that run. Other
//     GPU samples (no run, or a run already dropped) and host samples go by
//     their own time.
//
// One job applies it on plain PostgreSQL and on TimescaleDB alike; no
// TimescaleDB retention policy runs beside it.

// runTables are the tables whose rows belong to one run, dropped with it;
// runs comes last.
var runTables = []string{"steps", "layer_times", "evals", "events", "memory_breakdowns",
	"gpu_samples", "gpu_minutes", "gpu_device_minutes", "rank_hosts", "rollup_dirty", "metric_rollup_rows", "metric_rollup_sets", "metric_spread", "layer_rollups", "rank_score_heads", "rank_score_spans", "run_summaries", "runs"}

// retentionLock keeps replicas from running the job at the same time.
const retentionLock = migrationLock + 2

// retentionBatch is how many expired runs one query lists.
const retentionBatch = 100

// RetentionResult counts what one pass of [Store.ApplyRetention] dropped.
type RetentionResult struct {
	Runs        int   // runs dropped whole
	GPUSamples  int64 // GPU samples dropped by their own time
	HostSamples int64 // host samples dropped by their own time (plain PostgreSQL)
	Chunks      int64 // TimescaleDB chunks dropped: host samples, GPU aggregate, emptied chunks
	// Failures counts the runs that could not be dropped and the other
	// steps of the pass that failed; each is logged, and the pass goes on
	// without it.
	Failures int
	// Skipped is true when another process was running the job.
	Skipped bool
}

// ApplyRetention drops what the retention rule above says is older than
// keep. keep <= 0 keeps everything. Each run is dropped in its own
// transaction, under the locks that ingest and the rollup refresher take
// for it, and only if it is still inactive then: a run written to while
// the job runs stays whole. A run that cannot be dropped is logged with
// its id and counted in the result's Failures, and the pass goes on with
// the others (the next pass tries it again); so are the steps after the
// runs. The error is for a pass that could not run at all, or was
// cancelled.
func (s *Store) ApplyRetention(ctx context.Context, keep time.Duration) (RetentionResult, error) {
	var res RetentionResult
	if keep <= 0 {
		return res, nil
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return res, fmt.Errorf("retention: connect: %w", err)
	}
	defer conn.Release()
	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(retentionLock)).Scan(&locked); err != nil {
		return res, fmt.Errorf("retention: take lock: %w", err)
	}
	if !locked {
		res.Skipped = true
		return res, nil
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = conn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, int64(retentionLock))
	}()

	var cutoff time.Time
	if err := conn.QueryRow(ctx, `SELECT now() - $1::interval`, pgInterval(keep)).Scan(&cutoff); err != nil {
		return res, fmt.Errorf("retention: compute cutoff: %w", err)
	}
	ts, err := timescaleTables(ctx, conn)
	if err != nil {
		return res, fmt.Errorf("retention: %w", err)
	}
	// failed logs a step that failed and counts it, unless the pass was
	// cancelled, which ends it.
	failed := func(msg string, err error, attrs ...any) error {
		if ctx.Err() != nil {
			return fmt.Errorf("retention: cancelled: %w", err)
		}
		res.Failures++
		s.log.Error(msg, append(attrs, "err", err)...)
		return nil
	}
	after := ""
	for {
		rows, err := conn.Query(ctx, `SELECT run_id FROM runs WHERE updated_at < $1 AND run_id > $2
			ORDER BY run_id LIMIT $3`, cutoff, after, retentionBatch)
		if err != nil {
			return res, fmt.Errorf("retention: list expired runs: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return res, fmt.Errorf("retention: list expired runs: %w", err)
		}
		for _, id := range ids {
			dropped, err := s.dropExpiredRun(ctx, id, cutoff, ts["gpu_samples"])
			if err != nil {
				if err := failed("retention: run not dropped; the pass goes on with the others", err, "run_id", id); err != nil {
					return res, err
				}
				continue
			}
			if dropped {
				res.Runs++
				s.log.Info("retention: dropped run", "run_id", id)
			}
		}
		if len(ids) < retentionBatch {
			break
		}
		after = ids[len(ids)-1]
	}

	if n, err := s.dropUnattributedGPUSamples(ctx, cutoff, ts["gpu_samples"]); err != nil {
		if err := failed("retention: GPU samples of no run not dropped", err); err != nil {
			return res, err
		}
	} else {
		res.GPUSamples = n
	}

	if ts["host_samples"] {
		// Whole chunks: host samples belong to no run.
		var n int64
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM drop_chunks('host_samples', older_than => $1::timestamptz)`, cutoff).Scan(&n); err != nil {
			if err := failed("retention: host_samples chunks not dropped", err); err != nil {
				return res, err
			}
		}
		res.Chunks += n
	} else {
		tag, err := conn.Exec(ctx, `DELETE FROM host_samples WHERE time < $1`, cutoff)
		if err != nil {
			if err := failed("retention: old host samples not dropped", err); err != nil {
				return res, err
			}
		}
		res.HostSamples = tag.RowsAffected()
	}
	// The per-minute sums of host samples go by their own time too.
	if _, err := conn.Exec(ctx, `DELETE FROM host_minutes WHERE minute < date_trunc('minute', $1::timestamptz)`, cutoff); err != nil {
		if err := failed("retention: old host minutes not dropped", err); err != nil {
			return res, err
		}
	}
	if len(ts) > 0 {
		n, err := dropEmptyChunks(ctx, conn, cutoff)
		res.Chunks += n
		if err != nil {
			if err := failed("retention: empty chunks not dropped", err); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// dropExpiredRun drops run id whole if its last activity is still before
// cutoff once the run's locks are held. gpuHypertable says gpu_samples is
// a TimescaleDB hypertable, whose compressed chunks are searched for the
// run's samples by segment.
func (s *Store) dropExpiredRun(ctx context.Context, id string, cutoff time.Time, gpuHypertable bool) (bool, error) {
	dropped := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The run's lock, which every batch of the run holds shared (see
		// batch_locks.go), then the rollup refresher's: a batch or a refresh
		// of this run waits for the drop and, when it comes after, starts
		// from nothing.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared($3), pg_advisory_xact_lock($2),
			pg_advisory_xact_lock(`+refreshLockKey("$1")+`)`, id, runLockKey(id), wideBatchLock); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM runs
			WHERE run_id = $1 AND updated_at < $2 FOR UPDATE) AS r`, id, cutoff).Scan(&n); err != nil {
			return fmt.Errorf("recheck: %w", err)
		}
		if n == 0 {
			return nil // written to meanwhile, or gone
		}
		for _, t := range runTables {
			if t == "gpu_samples" {
				f := sampleFilter{`g.run_id = $1`, []any{id}}
				if _, err := deleteGPUSamples(ctx, tx, gpuHypertable, time.Time{}, f, f); err != nil {
					return fmt.Errorf("delete from gpu_samples: %w", err)
				}
				continue
			}
			if _, err := tx.Exec(ctx, `DELETE FROM `+t+` WHERE run_id = $1`, id); err != nil {
				return fmt.Errorf("delete from %s: %w", t, err)
			}
		}
		dropped = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("retention: drop run %s: %w", id, err)
	}
	return dropped, nil
}

// dropUnattributedGPUSamples drops the GPU samples older than cutoff that
// belong to no run: no run id, or the id of a run that does not exist.
// The ids of the runs that do not exist are read first, so that each
// delete compares run_id with a value (see deleteGPUSamples). A run
// created between the two keeps none of its samples older than cutoff,
// as when it is created just after the pass.
func (s *Store) dropUnattributedGPUSamples(ctx context.Context, cutoff time.Time, gpuHypertable bool) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT DISTINCT run_id FROM gpu_samples g
			WHERE time < $1 AND run_id <> '' AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = g.run_id)`, cutoff)
		if err != nil {
			return fmt.Errorf("list runs that do not exist: %w", err)
		}
		gone, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("list runs that do not exist: %w", err)
		}
		filters := []sampleFilter{{`g.time < $1 AND g.run_id = ''`, []any{cutoff}}}
		for _, id := range gone {
			filters = append(filters, sampleFilter{`g.time < $1 AND g.run_id = $2`, []any{cutoff, id}})
		}
		whole := sampleFilter{`g.time < $1 AND (g.run_id = '' OR NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = g.run_id))`, []any{cutoff}}
		n, err = deleteGPUSamples(ctx, tx, gpuHypertable, cutoff, whole, filters...)
		if err != nil {
			return err
		}
		// Their minute rollups go by the same rule, by whole minutes.
		if _, err := tx.Exec(ctx, `DELETE FROM gpu_device_minutes g WHERE g.minute < date_trunc('minute', $1::timestamptz)
			AND (g.run_id = '' OR NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = g.run_id))`, cutoff); err != nil {
			return fmt.Errorf("delete GPU minutes of no run: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("retention: drop old GPU samples of no run: %w", err)
	}
	return n, nil
}

// timescaleTables returns the hypertables and continuous aggregates of
// the current schema, none when TimescaleDB is not in use.
func timescaleTables(ctx context.Context, conn querier) (map[string]bool, error) {
	out := map[string]bool{}
	var on bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'timescaledb')`).Scan(&on); err != nil {
		return nil, fmt.Errorf("store: look up timescaledb: %w", err)
	}
	if !on {
		return out, nil
	}
	rows, err := conn.Query(ctx, `
		SELECT hypertable_name::text FROM timescaledb_information.hypertables WHERE hypertable_schema = current_schema()
		UNION ALL
		SELECT view_name::text FROM timescaledb_information.continuous_aggregates WHERE view_schema = current_schema()`)
	if err != nil {
		return nil, fmt.Errorf("store: list hypertables: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: list hypertables: %w", err)
	}
	for _, n := range names {
		out[n] = true
	}
	return out, nil
}

// dropEmptyChunks drops the chunks of the run-scoped hypertables that end
// before cutoff and hold no row any more (their runs were dropped), so
// that TimescaleDB's catalog does not grow with empty chunks. Each chunk
// is locked before it is checked, so a write into it (an import of old
// data) either comes first and keeps it or waits and finds it gone.
func dropEmptyChunks(ctx context.Context, conn *pgxpool.Conn, cutoff time.Time) (int64, error) {
	rows, err := conn.Query(ctx, `SELECT hypertable_name::text, chunk_schema::text, chunk_name::text, range_start, range_end
		FROM timescaledb_information.chunks
		WHERE hypertable_schema = current_schema() AND hypertable_name = ANY($1) AND range_end <= $2`,
		[]string{"steps", "layer_times", "evals", "events", "gpu_samples"}, cutoff)
	if err != nil {
		return 0, fmt.Errorf("retention: list old chunks: %w", err)
	}
	type chunk struct {
		table, schema, name string
		start, end          time.Time
	}
	var chunks []chunk
	for rows.Next() {
		var c chunk
		if err := rows.Scan(&c.table, &c.schema, &c.name, &c.start, &c.end); err != nil {
			rows.Close()
			return 0, fmt.Errorf("retention: list old chunks: %w", err)
		}
		chunks = append(chunks, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("retention: list old chunks: %w", err)
	}
	var dropped int64
	for _, c := range chunks {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			name := pgx.Identifier{c.schema, c.name}.Sanitize()
			if _, err := tx.Exec(ctx, `LOCK TABLE `+name+` IN SHARE ROW EXCLUSIVE MODE`); err != nil {
				return err
			}
			var empty bool
			if err := tx.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM `+name+`)`).Scan(&empty); err != nil {
				return err
			}
			if !empty {
				return nil
			}
			var n int64
			err := tx.QueryRow(ctx, `SELECT count(*) FROM drop_chunks($1::regclass, older_than => $2::timestamptz, newer_than => $3::timestamptz)`,
				c.table, c.end, c.start).Scan(&n)
			dropped += n
			return err
		})
		if err != nil {
			return dropped, fmt.Errorf("retention: drop empty chunk %s of %s: %w", c.name, c.table, err)
		}
	}
	return dropped, nil
}
