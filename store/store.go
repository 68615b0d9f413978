// Package store owns DeepSeed's SQL: the pgx pool, the schema migrations,
// bulk writes, read queries and TimescaleDB detection. No other package
// holds SQL or the pool; they call the methods of [Store], which answer
// plain Go rows.
//
// Usage:
//  1. s, err := store.Open(ctx, databaseURL, logger)
//  2. err = s.Migrate(ctx) — applies pending migrations/ files, safe when
//     several servers start at once.
//  3. Write batches and read with the methods of [Store]; Close when done.
//
// Files are named for the table or concept they hold, writes and reads
// together: steps.go (and steps_inline.go, steps_timings.go), layers.go and
// layers_rollup.go, evals.go, samples_gpu.go, samples_host.go, memory.go,
// events.go, runs.go, alerts.go, jobs*.go, rollups*.go, ranks*.go
// (ranks_scores.go: the stored straggler scores), wasted.go, retention*.go,
// timescale*.go, replica.go and admin.go (whole databases). A batch is written through
// one mechanism shared by every table, batch*.go: the plan and its
// transaction (batch.go), the advisory locks (batch_locks.go), COPY
// (batch_copy.go), the direct path for new keys (batch_direct.go), the merge
// of retries (batch_merge.go) and its TimescaleDB variant segment by segment
// (batch_compressed.go); each table's file gives it its columns, COPY row
// and merge statement.
package store

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/deepseed/deepseed/migrations"
)

// Store is DeepSeed's database.
type Store struct {
	pool *pgxpool.Pool
	log  *slog.Logger
	// Timescale is true when the timescaledb extension is installed in the
	// database and the time-series tables are hypertables.
	Timescale bool
	// queueVacuumAt is when VacuumDrainedQueue last vacuumed (Unix ns).
	queueVacuumAt atomic.Int64
}

// Open connects to the database at url. It does not wait for the database
// to be reachable: the pool connects lazily, so a server can start while
// the database is still coming up.
func Open(ctx context.Context, url string, log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	if cfg.MaxConns < 8 {
		cfg.MaxConns = 8
	}
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	// pgx prepares and caches each statement per connection, and after
	// five executions PostgreSQL may plan a cached statement once for any
	// parameters. A plan made while a table was small (a seq scan, say)
	// then stays while the table grows: writes of the ingest benchmark
	// fell from 115,000 to 12,000 records/s that way, on a generic plan of
	// the direct-path probe. TimescaleDB also excludes chunks and
	// compressed batches only by values known at planning. Planning each
	// execution with its values costs a fraction of a millisecond; the
	// URL's own setting wins.
	if _, set := cfg.ConnConfig.RuntimeParams["plan_cache_mode"]; !set && !strings.Contains(cfg.ConnConfig.RuntimeParams["options"], "plan_cache_mode") {
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create pool: %w", err)
	}
	return &Store{pool: pool, log: log}, nil
}

// Close closes the pool.
func (s *Store) Close() { s.pool.Close() }

// ResetConnections closes every pooled connection, idle ones at once and
// busy ones when released, so that the next calls connect anew: for a
// caller that knows the database ended its sessions (an administrator, a
// failover), whose pooled connections would each fail once.
func (s *Store) ResetConnections() { s.pool.Reset() }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("ping database: %w", err)
	}
	return nil
}

// migrationLock is the advisory lock key that serialises migrations of
// servers starting together ("deepseed" in ASCII).
const migrationLock = 0x6465657073656564

// Migration is one embedded SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations returns the embedded migrations in order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrations.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".sql") {
			continue
		}
		var v int
		if _, err := fmt.Sscanf(name, "%d_", &v); err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must start with a positive number and _", name)
		}
		b, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", name, err)
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("migrations %s and %s share version %d", out[i-1].Name, out[i].Name, out[i].Version)
		}
	}
	return out, nil
}

// Migrate applies every pending migration, each in its own transaction,
// and records it in schema_migrations. A session advisory lock makes
// concurrent callers wait for each other, so two servers starting at once
// apply each file exactly once. It returns the names applied.
func (s *Store) Migrate(ctx context.Context) ([]string, error) {
	ms, err := Migrations()
	if err != nil {
		return nil, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: connect: %w", err)
	}
	defer conn.Release()
	// A standby refuses every write: say so rather than fail on the first
	// CREATE with "cannot execute … in a read-only transaction".
	var standby bool
	if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&standby); err != nil {
		return nil, fmt.Errorf("migrate: ask whether the database is a standby: %w", err)
	}
	if standby {
		return nil, fmt.Errorf("migrate: %w", ErrStandby)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(migrationLock)); err != nil {
		return nil, fmt.Errorf("migrate: take lock: %w", err)
	}
	defer func() {
		// Unlock with a fresh context: ctx may be cancelled by now.
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = conn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, int64(migrationLock))
	}()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("migrate: create schema_migrations: %w", err)
	}
	applied := map[int]bool{}
	rows, err := conn.Query(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("migrate: read schema_migrations: %w", err)
	}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return nil, fmt.Errorf("migrate: read schema_migrations: %w", err)
		}
		applied[v] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("migrate: read schema_migrations: %w", err)
	}
	var done []string
	for _, m := range ms {
		if applied[m.Version] {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
			return err
		})
		if err != nil {
			return done, fmt.Errorf("migrate: apply %s: %w", m.Name, err)
		}
		s.log.Info("applied migration", "name", m.Name)
		done = append(done, m.Name)
	}
	return done, nil
}

// Migrated reports whether every embedded migration has been applied.
func (s *Store) Migrated(ctx context.Context) (bool, error) {
	ms, err := Migrations()
	if err != nil {
		return false, err
	}
	var n int
	// A pooled connection the server ended (a restart, an administrator)
	// fails once and is dropped: the next try takes another. The server
	// ends all of them at once, so tries go on while they fail that way,
	// one a pooled connection and one more, so that stale connections do
	// not read as a database that is away; any other failure gets one
	// more try.
	tries := int(s.pool.Config().MaxConns) + 1
	for try := 1; ; try++ {
		err = s.pool.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&n)
		if err == nil || ctx.Err() != nil || try >= tries || (try >= 2 && !connEnded(err)) {
			break
		}
	}
	if err != nil {
		return false, fmt.Errorf("read schema_migrations: %w", err)
	}
	return n >= len(ms), nil
}
