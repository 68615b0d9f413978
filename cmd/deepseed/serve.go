package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/deepseed/deepseed/internal/httplimit"
	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/store"
)

// ServeCommand runs the HTTP API.
type ServeCommand struct{}

const serveNotes = `
Tokens come from the environment only, never from flags (flags show in ps):
  DEEPSEED_INGEST_TOKENS  comma-separated tokens that may write (POST) and read
  DEEPSEED_READ_TOKENS    comma-separated tokens that may only read (GET)
  DEEPSEED_SUBMIT_TOKENS  comma-separated tokens that may queue and cancel jobs
                          and sweeps and set GPU quotas (and read)
  DEEPSEED_AGENT_TOKENS   comma-separated NAME:TOKEN of the agents on GPU nodes:
                          they claim jobs and report on them (and read), each
                          token only as the agent NAME (its --name); NAME*
                          binds every agent whose name starts with NAME
With none set the API takes no token, so serve listens on 127.0.0.1 only
and refuses a --listen other machines can reach unless --insecure-open says
so (logged as an error); the job routes that start processes still need a
submit or agent token.
Clients send "Authorization: Bearer <token>".

Endpoints: /api/v1/... (ingest and query; see /api/v1/openapi.json),
/healthz (process up), /readyz (database reachable and migrated; with
--read-database-url the read database too), /metrics (Prometheus text
format).

Scale-out: ingest servers (--role ingest) write to the primary; query
servers (--role query) may read from a hot standby with
--read-database-url while --database-url names the primary, where they
refresh rollups and run the background jobs. Answers about a running run
then carry replica_lag_s. A --database-url that leads to a standby is an
error at start (see docs/scale-out.md).

At start the server applies pending migrations, retrying for as long as the
database server is unreachable (it stays up, answers /readyz 503, logs the
wait at the first failure and once a minute, and recovers by itself). A
database that does not exist, or a refused user or password, cannot fix
itself: serve says what to do and exits 1. It uses
TimescaleDB when the extension is installed and preloaded; it logs which mode
it runs in and, in plain PostgreSQL mode, why. With --retention it drops
expired runs and samples hourly, in either mode.
On SIGTERM or Ctrl-C it stops accepting requests, finishes those in flight
and exits 0.

A write the database refuses for a reason that passes (disk full,
read-only, too many connections) is answered 503 with Retry-After, and
/readyz answers 503 until a write succeeds again. What a client can make
the server hold is bounded by --max-body-bytes, --read-header-timeout,
--body-timeout and --max-conns, never by what it announces (see
docs/durability.md).`

// Run implements command.
func (c *ServeCommand) Run(ctx context.Context, args []string) error {
	def := server.DefaultConfig()
	f := newEnvFlags("serve")
	listen := f.String("listen", "DEEPSEED_LISTEN", "",
		"address of the HTTP API, host:port or :port; unset: :8080 (every interface) when a token is configured, 127.0.0.1:8080 (this machine only) when none is")
	insecure := f.Bool("insecure-open", "DEEPSEED_INSECURE_OPEN", false,
		"serve the API with no token on a non-loopback --listen: anyone who reaches it reads and writes every run (logged as an error at start); without it serve refuses to start that way")
	role := f.String("role", "DEEPSEED_ROLE", def.Role, "routes to serve: all, ingest (POST /ingest and /import only) or query (the GET routes and the job routes: jobs, sweeps, quotas, agents)")
	httpf := addHTTPFlags(f, "ingest")
	straggler := f.String("straggler-pct", "DEEPSEED_STRAGGLER_PCT", strconv.FormatFloat(def.StragglerPct, 'g', -1, 64), "default margin past which GET /runs/{id}/ranks flags a straggler, in percent of the median busy time (its median lateness) or over the median step time when no lateness is recorded")
	shutdown := f.String("shutdown-timeout", "DEEPSEED_SHUTDOWN_TIMEOUT", def.ShutdownTimeout.String(), "how long in-flight requests may run after SIGTERM")
	retention := f.String("retention", "DEEPSEED_RETENTION", "0",
		"drop each run whose last write is older than this, whole, and GPU and host samples of no run older than this (e.g. 90d, 720h; see docs/retention.md); 0 keeps everything")
	alertsEvery := f.String("alerts-every", "DEEPSEED_ALERTS_EVERY", def.AlertsEvery.String(),
		"how often the detectors look at running runs for alerts (see docs/alerts.md); off turns them off")
	jobTimeout := f.String("job-heartbeat-timeout", "DEEPSEED_JOB_HEARTBEAT_TIMEOUT", def.JobHeartbeatTimeout.String(),
		"silence of an agent after which its running jobs are marked lost, and retried when they have retries left (see docs/jobs.md)")
	readURL := f.String("read-database-url", "DEEPSEED_READ_DATABASE_URL", "",
		"PostgreSQL URL the query routes read from, typically a hot standby of --database-url (which then takes every write: ingest, jobs, rollup refreshes, alerts, retention); needs --database-url and a role of query or all; see docs/scale-out.md")
	db := addDBFlags(f)
	f.setUsage("deepseed serve [flags]", "Run the HTTP API (ingest and query) against PostgreSQL or TimescaleDB.", serveNotes+"\n"+pprofNote)
	if err := f.parse(args); err != nil {
		return err
	}
	if f.fs.NArg() > 0 {
		f.fs.Usage()
		return errors.New("serve: takes no arguments")
	}

	dbc, errs := db.parse("serve", os.Stderr)
	cfg := def
	cfg.Role = *role
	cfg.IngestTokens = server.SplitTokens(os.Getenv("DEEPSEED_INGEST_TOKENS"))
	cfg.ReadTokens = server.SplitTokens(os.Getenv("DEEPSEED_READ_TOKENS"))
	cfg.SubmitTokens = server.SplitTokens(os.Getenv("DEEPSEED_SUBMIT_TOKENS"))
	cfg.AgentTokens = server.SplitTokens(os.Getenv("DEEPSEED_AGENT_TOKENS"))
	cfg.InsecureOpen = *insecure
	if cfg.Listen = strings.TrimSpace(*listen); cfg.Listen == "" {
		cfg.Listen = cfg.DefaultListen()
	}
	cfg.CompressAfter, cfg.Timescale = dbc.compressAfter, dbc.timescale
	var err error
	if cfg.Retention, err = server.ParseDuration(*retention); err != nil {
		errs = append(errs, &server.FieldError{Field: "retention", Value: *retention, Msg: err.Error()})
	}
	cfg.HTTP = httpf.parse(&errs)
	httplimit.SetMemoryLimit(cfg.HTTP.MaxInflightBytes)
	if cfg.StragglerPct, err = strconv.ParseFloat(*straggler, 64); err != nil {
		errs = append(errs, &server.FieldError{Field: "straggler-pct", Value: *straggler, Msg: "want a number"})
	}
	if *alertsEvery == "off" {
		cfg.AlertsEvery = -1
	} else if cfg.AlertsEvery, err = server.ParseDuration(*alertsEvery); err != nil || cfg.AlertsEvery <= 0 {
		errs = append(errs, &server.FieldError{Field: "alerts-every", Value: *alertsEvery, Msg: "want a duration above 0, or off"})
	}
	if cfg.JobHeartbeatTimeout, err = server.ParseDuration(*jobTimeout); err != nil {
		errs = append(errs, &server.FieldError{Field: "job-heartbeat-timeout", Value: *jobTimeout, Msg: err.Error()})
	}
	if cfg.ShutdownTimeout, err = server.ParseDuration(*shutdown); err != nil {
		errs = append(errs, &server.FieldError{Field: "shutdown-timeout", Value: *shutdown, Msg: err.Error()})
	}
	readDB := strings.TrimSpace(*readURL)
	switch {
	case readDB == "":
	case dbc.databaseURL == "":
		// A private PostgreSQL has no standby to read from.
		errs = append(errs, &server.FieldError{Field: "read-database-url", Value: "…", Msg: "needs --database-url, the primary it is a standby of"})
	case cfg.Role == server.RoleIngest:
		errs = append(errs, &server.FieldError{Field: "read-database-url", Value: "…", Msg: "only query routes read from it: use it with --role query or all"})
	default:
		if err := store.CheckURL(readDB); err != nil {
			// The URL may hold a password: name the field, not the value.
			errs = append(errs, &server.FieldError{Field: "read-database-url", Value: "…", Msg: "not a valid PostgreSQL URL or DSN"})
		}
	}
	errs = append(errs, unreportedFieldErrors(cfg.Validate(), errs)...)
	if len(errs) > 0 {
		return configError("serve", errs)
	}

	log := dbc.log
	if addr := os.Getenv("DEEPSEED_PPROF_LISTEN"); addr != "" {
		if err := servePprof(ctx, addr, log); err != nil {
			return fmt.Errorf("serve: DEEPSEED_PPROF_LISTEN: %w", err)
		}
	}
	if err := checkListen("serve", cfg.Listen); err != nil {
		return err
	}
	if err := checkDBHosts(ctx, "serve", "database-url", dbc.databaseURL); err != nil {
		return err
	}
	if err := checkDBHosts(ctx, "serve", "read-database-url", readDB); err != nil {
		return err
	}
	st, closeDB, err := openDatabase(ctx, dbc)
	if err != nil {
		return err
	}
	defer closeDB()
	read := st
	if readDB != "" {
		if read, err = store.Open(ctx, readDB, log.With("component", "store", "database", "read")); err != nil {
			return fmt.Errorf("open read database: %w", err)
		}
		defer read.Close()
		log.Info("query routes read from the read database; writes and background jobs go to the primary")
	}
	return server.NewReading(cfg, st, read, log).ListenAndServe(ctx)
}

// unreportedFieldErrors returns the field errors of err (a joined error)
// whose field is not already among reported, so a value that failed to
// parse is not reported twice.
func unreportedFieldErrors(err error, reported []error) []error {
	if err == nil {
		return nil
	}
	seen := map[string]bool{}
	for _, e := range reported {
		var fe *server.FieldError
		if errors.As(e, &fe) {
			seen[fe.Field] = true
		}
	}
	var out []error
	list := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	}
	for _, e := range list {
		var fe *server.FieldError
		if errors.As(e, &fe) && seen[fe.Field] {
			continue
		}
		out = append(out, e)
	}
	return out
}
