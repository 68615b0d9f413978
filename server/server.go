// Package server assembles DeepSeed's HTTP API: the ingest and query
// routes under /api/v1 behind bearer-token auth, health and readiness
// probes, Prometheus metrics, JSON errors and graceful shutdown.
//
// Usage:
//  1. srv := server.New(cfg, st, logger), or server.NewReading(cfg,
//     primary, standby, logger) for a server whose query routes read from
//     a hot standby of the primary (docs/scale-out.md)
//  2. err := srv.ListenAndServe(ctx) — applies migrations in the
//     background (retrying while the database is away), serves until ctx
//     is cancelled, then finishes in-flight requests and returns nil.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/alerts"
	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/internal/httplimit"
	"github.com/deepseed/deepseed/jobs"
	"github.com/deepseed/deepseed/query"
	"github.com/deepseed/deepseed/store"
)

// APIPrefix is the mount point of the versioned API.
const APIPrefix = "/api/v1"

// Server is DeepSeed's HTTP API over one store.
type Server struct {
	cfg   Config
	store *store.Store // the primary: writes, migrations, background jobs
	read  *store.Store // what the query routes read: the primary or a standby of it
	log   *slog.Logger
	echo  *echo.Echo
	auth  *authenticator
	prom  *serverMetrics
	jobs  *jobs.Handler // nil on ingest replicas
	// ingest is nil on query replicas; /readyz asks it whether writes
	// fail.
	ingest *ingest.Handler

	// prepared is set once migrations have been applied by this process.
	prepared atomic.Bool
	// mode is "timescaledb" or "postgresql" once known. setUp, from the
	// start of Prepare (or Serve), is closed then: writes wait for it.
	mode  atomic.Value
	setUp atomic.Pointer[chan struct{}]
	// notReady is the last readiness problem logged, "" once ready.
	notReady atomic.Value
	// primaryState is the last problem of the primary logged by a query
	// server that reads from a standby, "" while it answers.
	primaryState atomic.Value
	// readReady is set once the read database has been ready.
	readReady atomic.Bool
	// evaluator runs the detectors, once Serve has started it (query and
	// all-in-one roles).
	evaluator atomic.Pointer[alerts.Evaluator]
}

// New builds the server over one database. It touches neither the
// network nor the database: ListenAndServe or Serve start both.
func New(cfg Config, st *store.Store, log *slog.Logger) *Server {
	return NewReading(cfg, st, st, log)
}

// NewReading builds a server whose query routes read from read, a hot
// standby of primary (or primary itself), while everything that writes
// runs on primary: ingest, the job routes, migrations, the rollup
// refresher, the alert detectors and retention. A read that needs fresh
// rollups has them refreshed on primary first (see query.Options).
func NewReading(cfg Config, primary, read *store.Store, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if read == nil {
		read = primary
	}
	s := &Server{cfg: cfg, store: primary, read: read, log: log, auth: newAuthenticator(cfg.IngestTokens, cfg.ReadTokens), prom: newServerMetrics(primary)}
	s.auth.add(ScopeSubmit, cfg.SubmitTokens)
	s.auth.addAgents(cfg.AgentTokens)
	s.mode.Store("")
	s.notReady.Store("")
	s.primaryState.Store("")
	switch {
	case cfg.Open() && !IsLoopback(cfg.Listen):
		log.Error("INSECURE: NO API TOKENS and --insecure-open: the API is open to anyone who can reach " + cfg.Listen +
			": every run can be read and written without a token; set DEEPSEED_INGEST_TOKENS and DEEPSEED_READ_TOKENS to require bearer tokens")
	case cfg.Open():
		log.Warn("no API tokens configured: the API takes no token and listens on loopback only; set DEEPSEED_INGEST_TOKENS and DEEPSEED_READ_TOKENS to serve other machines",
			"listen", cfg.Listen)
	}

	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = s.handleError
	// observe runs outermost so it sees the final status of every request,
	// panics included; Recover turns a panic into a 500 and hands it back.
	e.Use(s.observe)
	e.Use(s.recover)
	e.Use(checkText)

	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", s.prom.handler(log, s.auth))
	// The API document is public: clients read it before they hold a token.
	e.GET(APIPrefix+"/openapi.json", serveOpenAPI)

	g := e.Group(APIPrefix, s.auth.middleware, unescapeParams)
	if cfg.Role == RoleAll || cfg.Role == RoleIngest || cfg.Role == "" {
		// ingest.New names its own component in the log.
		ih := ingest.New(primary, ingest.Options{MaxBodyBytes: cfg.HTTP.MaxBodyBytes, MaxBatchRows: cfg.HTTP.MaxBatchRows, Logger: log,
			SetUp: s.setUpDone})
		ih.Register(g)
		s.prom.reg.Writer(ih.WriteMetrics)
		s.ingest = ih
	}
	if cfg.Role == RoleAll || cfg.Role == RoleQuery || cfg.Role == "" {
		query.New(read, query.Options{Logger: log.With("component", "query"), StragglerPct: cfg.StragglerPct, Primary: primary, Alerts: &cfg.Alerts}).Register(g)
		s.prom.reg.Writer(alerts.Collector{Store: read}.WriteMetrics)
		s.prom.named.Writer(alerts.RunCollector{Store: read}.WriteMetrics)
		if s.reading() {
			registerReplica(s.prom.reg, read)
		}
		// The job routes write (queueing, claims, reports): primary only.
		s.jobs = jobs.New(primary, jobs.Options{Logger: log.With("component", "jobs"), HeartbeatTimeout: cfg.JobHeartbeatTimeout})
		s.jobs.Register(g)
	}
	s.echo = e
	return s
}

// Handler returns the HTTP handler, for tests and embedding.
func (s *Server) Handler() http.Handler { return s.echo }

// Routes lists the registered routes (method and echo path).
func (s *Server) Routes() []*echo.Route { return s.echo.Routes() }

// Mode returns "timescaledb" or "postgresql" once the database has been
// prepared, "" before.
func (s *Server) Mode() string { return s.mode.Load().(string) }

// beginSetUp returns the channel that Prepare closes once the database
// mode is known, made by the first call.
func (s *Server) beginSetUp() chan struct{} {
	ch := make(chan struct{})
	if s.setUp.CompareAndSwap(nil, &ch) {
		return ch
	}
	return *s.setUp.Load()
}

// setUpDone is nil where the server does not set its database up (its
// Handler serves without Prepare), else the channel closed once it has.
func (s *Server) setUpDone() <-chan struct{} {
	if ch := s.setUp.Load(); ch != nil {
		return *ch
	}
	return nil
}

// settingUp reports whether Prepare has yet to learn the database mode.
func (s *Server) settingUp() bool {
	ch := s.setUpDone()
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

// ListenAndServe listens on cfg.Listen and calls Serve.
func (s *Server) ListenAndServe(ctx context.Context) error {
	l, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.Listen, err)
	}
	return s.Serve(ctx, l)
}

// Serve answers requests on l until ctx is cancelled. Meanwhile it
// prepares the database in the background (see Prepare), so the process
// is up — healthy but not ready — while the database is unreachable. On
// cancellation it stops accepting connections, lets in-flight requests
// finish within cfg.ShutdownTimeout and returns nil.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	s.beginSetUp() // before the first request can come
	pctx, stopPrepare := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	prepErr := make(chan error, 1)
	go func() {
		defer wg.Done()
		if err := s.Prepare(pctx); err != nil {
			prepErr <- err
		}
	}()
	defer func() {
		stopPrepare()
		wg.Wait()
	}()

	hs := s.cfg.HTTP.Server(s.echo, s.log)
	s.log.Info("listening", "addr", l.Addr().String(), "role", s.roleName(), "max_conns", s.cfg.HTTP.MaxConns,
		"body_timeout", s.cfg.HTTP.BodyTimeout.String())
	l = s.cfg.HTTP.Listener(l, s.log)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve http: %w", err)
	case err := <-prepErr:
		_ = hs.Close()
		return err
	case <-ctx.Done():
	}
	timeout := s.cfg.ShutdownTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	s.log.Info("shutting down: no new connections, finishing in-flight requests", "timeout", timeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		_ = hs.Close()
		return fmt.Errorf("shutdown: requests still running after %s: %w", timeout, err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve http: %w", err)
	}
	s.log.Info("stopped")
	return nil
}

// reading reports whether the query routes read from a database other
// than the primary.
func (s *Server) reading() bool { return s.read != s.store }

func (s *Server) roleName() string {
	if s.cfg.Role == "" {
		return RoleAll
	}
	return s.cfg.Role
}

// Prepare applies pending migrations, retrying with backoff while the
// database is unreachable, then sets up TimescaleDB per cfg.Timescale
// (store.SetupMode) and logs once which mode the server runs in. It then
// runs the retention job when cfg.Retention is set and, unless the server
// only ingests, refreshes stale rollups in the background until ctx is
// cancelled. It returns an error only when the server cannot run as
// configured (--timescale=require without a usable TimescaleDB).
func (s *Server) Prepare(ctx context.Context) error {
	backoff := 250 * time.Millisecond
	const maxBackoff = 10 * time.Second
	var lastErr string
	var lastLog time.Time
	for attempt := 1; ; attempt++ {
		mctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		applied, err := s.store.Migrate(mctx)
		cancel()
		if err == nil {
			if len(applied) > 0 {
				s.log.Info("database migrated", "applied", applied)
			}
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		// A database that does not exist, or a refused login, stays so:
		// say what to do and stop. An unreachable server is waited for,
		// as long as it takes (it may be starting), logged at the first
		// failure, when the error changes and once a minute.
		if why := store.NeedsOperator(err); why != "" {
			return fmt.Errorf("database: %s", why)
		}
		if errors.Is(err, store.ErrStandby) {
			return fmt.Errorf("database: %w: it takes no migrations and no writes. Give the primary as --database-url (DEEPSEED_DATABASE_URL); "+
				"a query server reads from the standby with --read-database-url (DEEPSEED_READ_DATABASE_URL) beside it (docs/scale-out.md)", err)
		}
		if msg := err.Error(); attempt == 1 || msg != lastErr || time.Since(lastLog) >= time.Minute {
			s.log.Warn("database not reachable yet; retrying until it is", "attempt", attempt, "retry_in", backoff.String(), "err", err)
			lastErr, lastLog = msg, time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, maxBackoff)
	}
	s.prepared.Store(true)

	tctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	mode, err := s.store.SetupMode(tctx, s.cfg.Timescale, store.TimescaleOptions{CompressAfter: s.cfg.CompressAfter})
	switch {
	case err != nil && ctx.Err() != nil:
		return nil // shutting down
	case err != nil && s.cfg.Timescale == store.TimescaleRequire:
		return fmt.Errorf("database mode: %w", err)
	case err != nil:
		s.mode.Store("postgresql")
		s.log.Warn("database mode: plain PostgreSQL (TimescaleDB setup failed; every query works without it)", "err", err)
	case mode.Timescale:
		s.mode.Store("timescaledb")
		s.log.Info("database mode: TimescaleDB", "timescaledb_version", mode.Version,
			"retention", FormatDuration(s.cfg.Retention), "compress_after", FormatDuration(s.cfg.CompressAfter))
	default:
		s.mode.Store("postgresql")
		s.log.Info("database mode: plain PostgreSQL (every query works without TimescaleDB; compression is off)",
			"retention", FormatDuration(s.cfg.Retention), "why", mode.Why)
	}
	close(s.beginSetUp())

	var bg sync.WaitGroup
	if s.cfg.Retention > 0 {
		bg.Add(1)
		go func() {
			defer bg.Done()
			s.runRetention(ctx)
		}()
	}
	// Query replicas keep the step and layer rollups fresh in the
	// background, so that opening a long run's charts rarely waits for a
	// cold build. Readers still refresh what is left before they read.
	// The detectors run beside the refresher, never in the ingest path:
	// one server at a time (an advisory lock elects it) reads each
	// running run's newest rows every few seconds.
	if s.cfg.Role != RoleIngest && s.cfg.AlertsEvery >= 0 {
		bg.Add(1)
		go func() {
			defer bg.Done()
			trends := query.New(s.store, query.Options{Logger: s.log.With("component", "alerts"), StragglerPct: s.cfg.StragglerPct, Alerts: &s.cfg.Alerts})
			ev := &alerts.Evaluator{Store: s.store, Config: s.cfg.Alerts, Log: s.log, Trends: trends}
			s.evaluator.Store(ev)
			ev.Run(ctx, s.cfg.AlertsEvery)
		}()
	}
	// Jobs whose agent went silent are marked lost (and retried) by every
	// query replica; a job is marked once whoever gets there first.
	if s.jobs != nil {
		bg.Add(1)
		go func() {
			defer bg.Done()
			s.jobs.Reap(ctx)
		}()
	}
	if s.cfg.Role != RoleIngest {
		query.RunRefresher(ctx, s.store, 5*time.Second, s.log) // it names its component
	}
	bg.Wait()
	return nil
}

// runRetention applies the retention rule now and then every
// cfg.RetentionEvery (hourly by default) until ctx is cancelled. Replicas
// may all run it: one pass runs at a time.
func (s *Server) runRetention(ctx context.Context) {
	every := s.cfg.RetentionEvery
	if every <= 0 {
		every = time.Hour
	}
	log := s.log.With("component", "retention")
	for {
		start := time.Now()
		res, err := s.store.ApplyRetention(ctx, s.cfg.Retention)
		// The store logs each failure of a pass that ran (a run with its
		// id); the counter sums them.
		s.prom.retentionFailures.Add(res.Failures)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			s.prom.retentionFailures.Inc()
			log.Error("retention pass failed; retrying at the next one", "err", err, "next_in", every.String())
		case res.Failures > 0:
			log.Warn("retention pass left what failed for the next one", "horizon", FormatDuration(s.cfg.Retention),
				"failures", res.Failures, "runs_dropped", res.Runs, "gpu_samples_dropped", res.GPUSamples,
				"host_samples_dropped", res.HostSamples, "chunks_dropped", res.Chunks,
				"took", time.Since(start).Round(time.Millisecond).String(), "next_in", every.String())
		case res.Runs > 0 || res.GPUSamples > 0 || res.HostSamples > 0 || res.Chunks > 0:
			log.Info("retention pass", "horizon", FormatDuration(s.cfg.Retention), "runs_dropped", res.Runs,
				"gpu_samples_dropped", res.GPUSamples, "host_samples_dropped", res.HostSamples,
				"chunks_dropped", res.Chunks, "took", time.Since(start).Round(time.Millisecond).String())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// handleError writes every error as an [api.Error] JSON body.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	code := http.StatusInternalServerError
	body := api.Error{Error: "internal server error"}
	var he *echo.HTTPError
	if !errors.As(err, &he) || he.Code >= 500 {
		if httplimit.ClientGone(c.Request()) {
			// The client left before its answer: whatever failed did so
			// because it left. Nobody reads this answer.
			s.log.Debug("request abandoned by its client", "method", c.Request().Method, "path", c.Request().URL.Path, "err", err)
			_ = c.NoContent(httplimit.StatusClientClosedRequest)
			return
		}
	}
	if errors.As(err, &he) {
		code = he.Code
		switch m := he.Message.(type) {
		case api.Error:
			body = m
		case *api.Error:
			body = *m
		case string:
			body.Error = m
		case error:
			body.Error = m.Error()
		default:
			body.Error = http.StatusText(code)
		}
		if he.Internal != nil && code >= 500 {
			s.log.Error("request failed", "method", c.Request().Method, "path", c.Request().URL.Path, "err", he.Internal)
		}
	} else {
		// A handler's unexpected error: log it, do not show internals.
		s.log.Error("request failed", "method", c.Request().Method, "path", c.Request().URL.Path, "err", err)
	}
	switch code {
	case http.StatusNotFound:
		if body.Error == "Not Found" {
			body.Error = "not found: " + c.Request().Method + " " + c.Request().URL.Path
		}
	case http.StatusMethodNotAllowed:
		if body.Error == "Method Not Allowed" {
			body.Error = "method " + c.Request().Method + " not allowed on " + c.Request().URL.Path
		}
	}
	if c.Request().Method == http.MethodHead {
		err = c.NoContent(code)
	} else {
		err = c.JSON(code, body)
	}
	if err != nil {
		s.log.Debug("write error response", "err", err)
	}
}
