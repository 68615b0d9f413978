package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Database administration: what the command line does to a server or a
// database as a whole, on a connection of its own rather than the pool.

// CheckURL reports whether url is a PostgreSQL URL or DSN pgx can use.
// Its error may quote the URL, password included: callers name the field
// rather than show the error.
func CheckURL(url string) error {
	if _, err := pgx.ParseConfig(url); err != nil {
		return fmt.Errorf("parse database url: %w", err)
	}
	return nil
}

// EnsureDatabase creates database name on the server of adminURL unless it
// exists.
func EnsureDatabase(ctx context.Context, adminURL, name string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return fmt.Errorf("look up database %s: %w", name, err)
	}
	if !exists {
		if _, err := conn.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()); err != nil {
			return fmt.Errorf("create database %s: %w", name, err)
		}
	}
	return nil
}

// SetReadOnly makes the database of url refuse writes (on) or take them
// again (off), as a standby or default_transaction_read_only does, and ends
// the database's other sessions so that the next ones take the setting.
func SetReadOnly(ctx context.Context, url string, on bool) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	db := pgx.Identifier{conn.Config().Database}.Sanitize()
	// This session starts read-only too once the setting is on.
	if _, err := conn.Exec(ctx, `SET default_transaction_read_only = off`); err != nil {
		return err
	}
	set := `ALTER DATABASE ` + db + ` RESET default_transaction_read_only`
	if on {
		set = `ALTER DATABASE ` + db + ` SET default_transaction_read_only = on`
	}
	if _, err := conn.Exec(ctx, set); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	return err
}

// Checkpoint forces a checkpoint (CHECKPOINT needs a superuser or
// pg_checkpoint), so that benchmark phases start from the same state.
func (s *Store) Checkpoint(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("store: checkpoint: %w", err)
	}
	return nil
}

// PoolStats are the connection pool's figures, for /metrics.
type PoolStats struct {
	Acquired, Idle, Total, Constructing, Max  int32
	Acquires, EmptyAcquires, CanceledAcquires int64
	AcquireWait                               time.Duration
}

// PoolStats returns the pool's figures now.
func (s *Store) PoolStats() PoolStats {
	st := s.pool.Stat()
	return PoolStats{
		Acquired: st.AcquiredConns(), Idle: st.IdleConns(), Total: st.TotalConns(),
		Constructing: st.ConstructingConns(), Max: st.MaxConns(),
		Acquires: st.AcquireCount(), EmptyAcquires: st.EmptyAcquireCount(), CanceledAcquires: st.CanceledAcquireCount(),
		AcquireWait: st.AcquireDuration(),
	}
}
