package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// What DeepSeed does about TimescaleDB (the --timescale flag).
const (
	// TimescaleAuto uses TimescaleDB where the database server has it
	// installed and preloaded, and plain PostgreSQL otherwise.
	TimescaleAuto = "auto"
	// TimescaleRequire fails unless TimescaleDB can be used.
	TimescaleRequire = "require"
)

// DatabaseMode says how the database is used.
type DatabaseMode struct {
	Timescale bool
	Version   string // the timescaledb extension's version
	// Why says, in plain mode, why TimescaleDB is not used and how to
	// turn it on.
	Why string
}

func (m DatabaseMode) String() string {
	if m.Timescale {
		return "TimescaleDB " + m.Version
	}
	return "plain PostgreSQL"
}

// errNotPreloaded is SetupTimescale's answer where the server's
// shared_preload_libraries is visible and lacks timescaledb.
var errNotPreloaded = errors.New("timescaledb: installed but not in shared_preload_libraries")

// Reasons for plain mode, one per case the server cannot fix by itself.
const (
	whyNotInstalled = "the timescaledb extension is not installed on the database server; " +
		"install TimescaleDB and add timescaledb to shared_preload_libraries to use hypertables and compression"
	whyNotPreloaded = "the timescaledb extension is installed but not preloaded; " +
		"add timescaledb to shared_preload_libraries in postgresql.conf and restart PostgreSQL to use it"
	whyNoPrivilege = "the database user may not create the timescaledb extension; " +
		"run CREATE EXTENSION timescaledb in the database once as a superuser to use it"
)

// SetupMode runs SetupTimescale (after Migrate) and applies one rule,
// the same for serve and migrate: where TimescaleDB is not installed, not
// preloaded, or may not be created by this user, the database runs in
// plain PostgreSQL mode, and DatabaseMode.Why says why and how to enable
// TimescaleDB, unless want is TimescaleRequire, which makes it an error.
// Any other failure is returned as an error.
func (s *Store) SetupMode(ctx context.Context, want string, opt TimescaleOptions) (DatabaseMode, error) {
	on, version, err := s.SetupTimescale(ctx, opt)
	// Replacing the policies takes locks that TimescaleDB's job scheduler
	// also takes, in another order: a deadlock here is retried.
	for try := 1; try < 4 && isDeadlock(err) && ctx.Err() == nil; try++ {
		on, version, err = s.SetupTimescale(ctx, opt)
	}
	mode := DatabaseMode{Timescale: on, Version: version}
	switch {
	case err == nil && on:
		return mode, nil
	case err == nil:
		mode.Why = whyNotInstalled
	default:
		var pe *pgconn.PgError
		switch {
		case errors.Is(err, errNotPreloaded):
			mode.Why = whyNotPreloaded
		case strings.Contains(err.Error(), "must be preloaded"):
			// The FATAL answer to CREATE EXTENSION may reach us as the
			// closed connection's error rather than a PgError.
			mode.Why = whyNotPreloaded
			s.pool.Reset()
		case !errors.As(err, &pe):
			return mode, err
		case strings.Contains(pe.Message, "must be preloaded") || strings.Contains(pe.Hint, "shared_preload_libraries"):
			mode.Why = whyNotPreloaded
			// A backend that tried to load the library without the
			// preload is best not reused.
			s.pool.Reset()
		case pe.Code == "42501": // insufficient_privilege
			mode.Why = whyNoPrivilege
		default:
			return mode, err
		}
	}
	if want == TimescaleRequire {
		return mode, fmt.Errorf("TimescaleDB required (--timescale=require) but unusable: %s", mode.Why)
	}
	return mode, nil
}

func isDeadlock(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}
