package server

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// Readiness answers GET /readyz.
type Readiness struct {
	Ready bool   `json:"ready"`
	Mode  string `json:"mode,omitempty"`
	Error string `json:"error,omitempty"`
	// ReadDatabase is the database the query routes read from, on a
	// server given one beside the primary (docs/scale-out.md).
	ReadDatabase *ReadDatabase `json:"read_database,omitempty"`
	// PrimaryError says what is wrong with the primary on a query server
	// that stays ready because it reads from a standby that answers:
	// reads go on, with rollups as the standby has them; the alert
	// detectors and the job routes wait for the primary.
	PrimaryError string `json:"primary_error,omitempty"`
	// Rollups, on a server that refreshes them (roles all and query),
	// says how far the rollups of every run are behind the raw rows. A
	// backlog never makes the server unready: reads answer from the
	// rollups as they are and say so (api.RollupLag). A database that
	// does not answer is a 503 with error instead.
	Rollups *RollupState `json:"rollups,omitempty"`
}

// RollupState is the rollup refresher's backlog over every run.
type RollupState struct {
	// Behind is true while rank-blocks wait for a refresh.
	Behind bool `json:"behind"`
	// Blocks counts the rank-blocks of 100 steps waiting.
	Blocks int64 `json:"blocks"`
	// BehindS is how long the oldest of them has waited, in seconds.
	BehindS api.Float `json:"behind_s"`
}

// ReadDatabase is the state of the database the query routes read from.
type ReadDatabase struct {
	Ready bool `json:"ready"`
	// Standby is true when it is a hot standby of the primary.
	Standby bool `json:"standby"`
	// ReplicaLagS is how many seconds a standby's data is behind the
	// primary's (see store.Replication).
	ReplicaLagS *api.Float `json:"replica_lag_s,omitempty"`
	Error       string     `json:"error,omitempty"`
}

// writesWhy is the readiness problem of a database that refuses writes.
const writesWhy = "database refuses writes"

// setupWhy is the readiness problem of a server whose tables are still
// being set up: it takes no writes yet.
const setupWhy = "database setup in progress"

// readPrefix starts the readiness problems of the read database.
const readPrefix = "read database "

// readyz answers 200 when every database the server's role answers from
// is reachable and migrated: the primary for ingest and for a server of
// both roles, the read database for a query server given one (the
// primary otherwise). A server that ingests also answers 503 while the
// primary refuses its writes for a reason that passes (see
// ingest.Handler.WritesFailing), until a write succeeds. The answer says why in general words; the details
// (the database's address, its error) go to the log, once each time they
// change, and never to whoever can reach the port.
func (s *Server) readyz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	primaryWhy, primaryErr := migratedWhy(ctx, s.store)
	var out Readiness
	var readWhy string
	var readErr error
	if s.reading() {
		out.ReadDatabase, readWhy, readErr = readState(ctx, s.read)
	}
	needPrimary := s.cfg.Role != RoleQuery || !s.reading()
	var writesErr error
	if needPrimary && s.ingest != nil {
		writesErr = s.ingest.WritesFailing()
	}
	switch {
	case needPrimary && primaryWhy != "":
		s.noteNotReady(primaryWhy, primaryErr)
		out.Error = primaryWhy
		return c.JSON(http.StatusServiceUnavailable, out)
	case s.ingest != nil && s.settingUp():
		// The tables are being set up (TimescaleDB's hypertables): writes
		// wait for it (ingest.Options.SetUp).
		s.noteNotReady(setupWhy, nil)
		out.Error = setupWhy
		return c.JSON(http.StatusServiceUnavailable, out)
	case writesErr != nil:
		// The database answers but refuses writes for a reason that
		// passes (disk full, read-only, too many connections): senders
		// are answered 503 and keep their records meanwhile.
		s.noteNotReady(writesWhy, writesErr)
		out.Error = writesWhy
		return c.JSON(http.StatusServiceUnavailable, out)
	case readWhy != "":
		s.noteNotReady(readPrefix+readWhy, readErr)
		out.Error = readPrefix + readWhy
		return c.JSON(http.StatusServiceUnavailable, out)
	}
	if s.reading() {
		s.readReady.Store(true)
	}
	s.noteNotReady("", nil)
	out.Ready, out.Mode, out.PrimaryError = true, s.Mode(), primaryWhy
	s.notePrimary(primaryWhy, primaryErr)
	if s.cfg.Role != RoleIngest && primaryWhy == "" {
		out.Rollups = s.rollupState(ctx)
	}
	return c.JSON(http.StatusOK, out)
}

// migratedWhy says, in general words, why st is not ready ("" when it
// is). Migrated runs one query: it proves the database answers and that
// every migration is in, whoever applied it (on a standby: that the
// primary's migrations have been replayed).
func migratedWhy(ctx context.Context, st *store.Store) (string, error) {
	ok, err := st.Migrated(ctx)
	switch {
	case err != nil:
		return "database unreachable", err
	case !ok:
		return "migrations pending", nil
	}
	return "", nil
}

// readState checks the read database and reads its replication state.
func readState(ctx context.Context, st *store.Store) (*ReadDatabase, string, error) {
	if why, err := migratedWhy(ctx, st); why != "" {
		return &ReadDatabase{Error: why}, why, err
	}
	rep, err := st.Replication(ctx)
	if err != nil {
		return &ReadDatabase{Error: "database unreachable"}, "database unreachable", err
	}
	rd := &ReadDatabase{Ready: true, Standby: rep.Standby}
	if rep.Standby {
		lag := api.Float(rep.Lag.Seconds())
		rd.ReplicaLagS = &lag
	}
	return rd, "", nil
}

// noteNotReady logs why the server is not ready when that changes.
func (s *Server) noteNotReady(why string, err error) {
	detail := why
	if err != nil {
		detail += ": " + err.Error()
	}
	if prev, _ := s.notReady.Swap(detail).(string); prev == detail {
		return
	}
	switch {
	case why == "":
		s.log.Info("ready")
	case !s.prepared.Load(), why == setupWhy, strings.HasPrefix(why, readPrefix) && !s.readReady.Load():
		// Not ready while starting is the normal course: the migrations
		// are being applied, or the database is being waited for (Prepare
		// logs that), or a standby has yet to replay the migrations.
		s.log.Info("not ready yet: starting", "reason", why)
	case err != nil:
		s.log.Warn("not ready", "reason", why, "err", err)
	default:
		s.log.Warn("not ready", "reason", why)
	}
}

// notePrimary logs, when it changes, a problem of the primary that a
// query server reading from a standby serves through.
func (s *Server) notePrimary(why string, err error) {
	detail := why
	if err != nil {
		detail += ": " + err.Error()
	}
	if prev, _ := s.primaryState.Swap(detail).(string); prev == detail {
		return
	}
	switch {
	case why == "":
		s.log.Info("primary database answers again")
	default:
		s.log.Warn("primary database: serving reads from the standby meanwhile; rollups are not refreshed and the detectors wait",
			"reason", why, "err", err)
	}
}

// rollupState reads the refresher's backlog on the primary, where the
// markers are written; nil when it cannot be read within the readiness
// deadline (the answer stays about the databases).
func (s *Server) rollupState(ctx context.Context) *RollupState {
	b, err := s.store.TotalRollupBacklog(ctx)
	if err != nil {
		s.log.Debug("readiness: rollup backlog not read", "err", err)
		return nil
	}
	return &RollupState{Behind: b.Blocks > 0, Blocks: b.Blocks, BehindS: api.Float(b.Behind(time.Now()).Seconds())}
}
