package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// TimescaleOptions configures the TimescaleDB policies.
type TimescaleOptions struct {
	// CompressAfter compresses chunks whose data is older than it; 0
	// means 7 days.
	CompressAfter time.Duration
}

// hypertable describes how one time-series table is partitioned and
// compressed. segmentBy columns are those queries filter on (so a
// compressed segment holds one run's rank or one GPU), orderBy the order
// rows are read in.
type hypertable struct {
	name      string
	chunk     string // chunk_time_interval
	segmentBy string
	orderBy   string
}

var hypertables = []hypertable{
	{"steps", "1 day", "run_id, rank", "step"},
	{"layer_times", "1 day", "run_id, rank", "step"},
	{"evals", "7 days", "run_id", "step"},
	{"events", "7 days", "run_id", "time"},
	{"gpu_samples", "1 day", "host, gpu", "time"},
	{"host_samples", "1 day", "host", "time"},
}

// timescaleLock serialises SetupTimescale across servers starting at once.
const timescaleLock = migrationLock + 1

// SetupTimescale turns the time-series tables into TimescaleDB
// hypertables with compression (retention is ApplyRetention's), when the timescaledb
// extension is available to the database. It is idempotent: run it at
// every start, after Migrate. Where the extension is not available it
// changes nothing and returns false, "", nil.
//
// Every query of DeepSeed works on the plain tables either way: hypertables
// keep their names and columns.
func (s *Store) SetupTimescale(ctx context.Context, opt TimescaleOptions) (enabled bool, version string, err error) {
	if opt.CompressAfter <= 0 {
		opt.CompressAfter = 7 * 24 * time.Hour
	}
	var available bool
	if err := s.pool.QueryRow(ctx,
		`SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'timescaledb')`).Scan(&available); err != nil {
		return false, "", fmt.Errorf("timescaledb: look up extension: %w", err)
	}
	if !available {
		s.Timescale = false
		return false, "", nil
	}
	// Without the preload, CREATE EXTENSION fails with FATAL, which ends
	// the connection and leaves a FATAL line in the server's log at every
	// start. Where the setting is visible to this user (superusers,
	// pg_read_all_settings; pg_settings hides it from others), that case
	// is known beforehand.
	var preload string
	switch err := s.pool.QueryRow(ctx,
		`SELECT setting FROM pg_settings WHERE name = 'shared_preload_libraries'`).Scan(&preload); {
	case errors.Is(err, pgx.ErrNoRows):
		// Not visible: CREATE EXTENSION tells.
	case err != nil:
		return false, "", fmt.Errorf("timescaledb: read shared_preload_libraries: %w", err)
	case !strings.Contains(preload, "timescaledb"):
		s.Timescale = false
		return false, "", errNotPreloaded
	}

	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(timescaleLock)); err != nil {
			return fmt.Errorf("take lock: %w", err)
		}
		// Needs timescaledb in shared_preload_libraries and a role allowed
		// to create the extension; otherwise this fails and the server
		// stays on plain PostgreSQL.
		if _, err := tx.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS timescaledb`); err != nil {
			return fmt.Errorf("create extension: %w", err)
		}
		if err := tx.QueryRow(ctx, `SELECT extversion FROM pg_extension WHERE extname = 'timescaledb'`).Scan(&version); err != nil {
			return fmt.Errorf("read version: %w", err)
		}
		for _, h := range hypertables {
			if err := setupHypertable(ctx, tx, h, opt); err != nil {
				return fmt.Errorf("%s: %w", h.name, err)
			}
		}
		return nil
	})
	if err != nil {
		return false, "", fmt.Errorf("timescaledb: %w", err)
	}
	// Earlier versions kept a per-minute continuous aggregate of GPU
	// samples that nothing read; /gpus reads the samples in one pass (a
	// day of 8 GPUs at 1 Hz in about 0.35 s, compressed), and an aggregate
	// refreshed over the last day would miss samples that arrive later
	// (imports, a collector's spool after a long outage). Dropping it also
	// removes its refresh job.
	if _, err := s.pool.Exec(ctx, `DROP MATERIALIZED VIEW IF EXISTS gpu_samples_1m`); err != nil {
		return false, "", fmt.Errorf("timescaledb: drop gpu_samples_1m: %w", err)
	}
	s.Timescale = true
	return true, version, nil
}

func setupHypertable(ctx context.Context, tx pgx.Tx, h hypertable, opt TimescaleOptions) error {
	// Old (pre-2.13) interface, still supported and available on every 2.x:
	// create_hypertable(relation, time_column_name, chunk_time_interval,
	// if_not_exists, migrate_data). migrate_data moves rows written while
	// the server ran on plain PostgreSQL into chunks.
	if _, err := tx.Exec(ctx, `SELECT create_hypertable($1::regclass, 'time',
		chunk_time_interval => $2::interval, if_not_exists => true, migrate_data => true)`,
		h.name, h.chunk); err != nil {
		return fmt.Errorf("create_hypertable: %w", err)
	}
	// Compression settings cannot change once chunks are compressed, so
	// they are set only the first time.
	var compressed bool
	if err := tx.QueryRow(ctx, `SELECT compression_enabled FROM timescaledb_information.hypertables
		WHERE hypertable_schema = current_schema() AND hypertable_name = $1`, h.name).Scan(&compressed); err != nil {
		return fmt.Errorf("read compression state: %w", err)
	}
	if !compressed {
		// ALTER TABLE takes no bind parameters; names and columns are the
		// constants of the hypertables table above.
		q := fmt.Sprintf(`ALTER TABLE %s SET (timescaledb.compress,
			timescaledb.compress_segmentby = '%s', timescaledb.compress_orderby = '%s')`,
			pgx.Identifier{h.name}.Sanitize(), h.segmentBy, h.orderBy)
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("enable compression: %w", err)
		}
	}
	// The compression policy is replaced only when its interval differs
	// from the configuration: replacing it at every start churned the job
	// table and took locks that TimescaleDB's scheduler takes in another
	// order (a deadlock whenever the job was running). The transaction
	// makes a swap atomic.
	want := pgInterval(opt.CompressAfter)
	var same bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM timescaledb_information.jobs
		WHERE proc_name = 'policy_compression' AND hypertable_schema = current_schema() AND hypertable_name = $1
		  AND (config->>'compress_after')::interval = $2::interval)`, h.name, want).Scan(&same); err != nil {
		return fmt.Errorf("read compression policy: %w", err)
	}
	if !same {
		if _, err := tx.Exec(ctx, `SELECT remove_compression_policy($1::regclass, if_exists => true)`, h.name); err != nil {
			return fmt.Errorf("remove_compression_policy: %w", err)
		}
		if _, err := tx.Exec(ctx, `SELECT add_compression_policy($1::regclass, compress_after => $2::interval, if_not_exists => true)`,
			h.name, want); err != nil {
			return fmt.Errorf("add_compression_policy: %w", err)
		}
	}
	// Retention is the server's job (ApplyRetention), which drops whole
	// runs by their last activity; a TimescaleDB policy dropping chunks by
	// the data's own time would break that rule, so remove any that an
	// earlier version set.
	var retained bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM timescaledb_information.jobs
		WHERE proc_name = 'policy_retention' AND hypertable_schema = current_schema() AND hypertable_name = $1)`, h.name).Scan(&retained); err != nil {
		return fmt.Errorf("read retention policy: %w", err)
	}
	if retained {
		if _, err := tx.Exec(ctx, `SELECT remove_retention_policy($1::regclass, if_exists => true)`, h.name); err != nil {
			return fmt.Errorf("remove_retention_policy: %w", err)
		}
	}
	return nil
}

// pgInterval writes d as a PostgreSQL interval literal.
func pgInterval(d time.Duration) string {
	if d <= 0 {
		panic(errors.New("pgInterval: duration must be positive"))
	}
	return fmt.Sprintf("%d seconds", int64(d.Round(time.Second)/time.Second))
}
