package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// IsUnavailable reports whether err means the database cannot be reached
// or is not taking work right now, for a reason that passes: connection
// refused, the pool cannot connect, the server shutting down or starting
// up, a connection lost mid-transaction, a deadline passed while
// connecting or waiting for a connection, too many connections, a full
// disk or another resource exhausted (SQLSTATE class 53), an I/O error of
// the server (class 58), a read-only transaction (a standby, or
// default_transaction_read_only), a lock not available, a serialization
// failure or a deadlock. Ingest answers these with 503 and Retry-After,
// because the same batch will succeed once the database is back; every
// other error is a bug or bad data and must not be retried blindly.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "08"): // connection_exception class
			return true
		case pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03": // admin/crash shutdown, cannot connect now
			return true
		case strings.HasPrefix(pe.Code, "53"): // insufficient resources: disk full (53100), out of memory, too many connections (53300)
			return true
		case strings.HasPrefix(pe.Code, "58"): // system error: an I/O error of the server, a file it could not open
			return true
		case pe.Code == "55P03": // lock_not_available
			return true
		case pe.Code == "40001", pe.Code == "40P01": // serialization failure, deadlock: retrying succeeds
			return true
		case pe.Code == "25006": // read_only_sql_transaction: see IsReadOnly
			return true
		}
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		return true
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var ne *net.OpError
	if errors.As(err, &ne) {
		return true
	}
	// pgx reports a connection that died under a statement this way.
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "closed pool")
}

// IsReadOnly reports whether err is a write refused because the database
// is a hot standby (SQLSTATE 25006). IsUnavailable counts it too: during
// a failover the address of the primary may lead to a standby for a
// while, and the same write succeeds once it leads to the new primary. A
// server configured with a standby as its primary stops at start instead
// (see ErrStandby).
func IsReadOnly(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "25006"
}

// IsDataError reports whether err is the database refusing a value of the
// batch itself (a data exception, a program limit such as a row too large,
// a NOT NULL or CHECK violation): writing the same batch again fails the
// same way, so it is the sender's to fix, not to retry.
func IsDataError(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	return strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "54") ||
		pe.Code == "23502" || pe.Code == "23514"
}

// DataErrorMessage is the database's words for a data error, without the
// statement: what a sender may be told.
func DataErrorMessage(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		if pe.Detail != "" {
			return pe.Message + " (" + pe.Detail + ")"
		}
		return pe.Message
	}
	return err.Error()
}

// NeedsOperator says, for an error that retrying cannot fix, what is
// wrong and what to do: the database named in the URL does not exist, or
// the server refuses the user or its password. For any other error, an
// unreachable server included, it returns "".
func NeedsOperator(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return ""
	}
	where := ""
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Config != nil {
		where = fmt.Sprintf("the PostgreSQL server at %s:%d says: ", ce.Config.Host, ce.Config.Port)
	}
	if strings.Contains(pe.Message, "must be preloaded") {
		// The database holds TimescaleDB's objects, and the server was
		// restarted without the library: no query on them can run.
		return where + pe.Message + "; this database was set up with TimescaleDB: add timescaledb to shared_preload_libraries in postgresql.conf and restart PostgreSQL"
	}
	switch pe.Code {
	case "3D000": // invalid_catalog_name
		return where + pe.Message + "; create it (createdb, or CREATE DATABASE as a superuser) or name an existing database in the URL"
	case "28P01": // invalid_password
		return where + pe.Message + "; check the user and password in the database URL"
	case "28000": // invalid_authorization_specification: no such role, or pg_hba.conf refuses
		return where + pe.Message + "; check the user in the database URL and the server's pg_hba.conf"
	}
	return ""
}

// connEnded reports whether err is the failure of a pooled connection that
// the database server ended while it sat idle (terminated by an
// administrator or a restart, or found closed): the pool drops it, and the
// same statement on another connection may succeed.
func connEnded(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "57P01" // admin_shutdown: terminated by pg_terminate_backend or a shutdown
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return false // a new connection that failed: the server is away
	}
	if pgconn.SafeToRetry(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	return strings.Contains(err.Error(), "conn closed")
}
