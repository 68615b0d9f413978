package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/deepseed/deepseed/internal/httplimit"
	"github.com/deepseed/deepseed/internal/localpg"
	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/store"
)

// envFlags is a flag set whose defaults come from environment variables,
// with a usage text that names each flag's variable.
type envFlags struct {
	fs      *flag.FlagSet
	specs   []envFlag
	refused map[string]string // flag name → what to do instead
}

type envFlag struct{ name, env, def, usage string }

func newEnvFlags(name string) *envFlags {
	fs := flag.NewFlagSet("deepseed "+name, flag.ContinueOnError)
	return &envFlags{fs: fs}
}

// String defines --name, defaulting to $env when set, else def.
func (f *envFlags) String(name, env, def, usage string) *string {
	v := def
	if e := os.Getenv(env); env != "" && e != "" {
		v = e
	}
	f.specs = append(f.specs, envFlag{name, env, def, usage})
	return f.fs.String(name, v, usage)
}

// Bool defines a boolean --name, defaulting to $env when it is set to a
// boolean (1, true, 0, false …), else def.
func (f *envFlags) Bool(name, env string, def bool, usage string) *bool {
	v := def
	if e, err := strconv.ParseBool(os.Getenv(env)); env != "" && err == nil {
		v = e
	}
	shown := ""
	if def {
		shown = "true"
	}
	f.specs = append(f.specs, envFlag{name, env, shown, usage})
	return f.fs.Bool(name, v, usage)
}

// Func defines --name handled by fn, with no environment variable.
func (f *envFlags) Func(name, usage string, fn func(string) error) {
	f.specs = append(f.specs, envFlag{name: name, usage: usage})
	f.fs.Func(name, usage, fn)
}

// setUsage installs a usage text: synopsis, description, then every flag
// with its environment variable and built-in default, then extra notes.
// Every command prints its flags this one way: --name on its own line,
// then what it does, then its variable and default.
func (f *envFlags) setUsage(synopsis, description, notes string) {
	f.fs.Usage = func() {
		w := f.fs.Output()
		fmt.Fprintf(w, "Usage: %s\n\n%s\n\nFlags %s:\n", synopsis, strings.TrimSpace(description), flagsEnvNote)
		listed := map[string]bool{}
		for _, s := range f.specs {
			listed[s.name] = true
			printFlag(w, s)
		}
		// A flag defined on fs directly is still shown, in the same form.
		f.fs.VisitAll(func(fl *flag.Flag) {
			if !listed[fl.Name] {
				printFlag(w, envFlag{name: fl.Name, def: fl.DefValue, usage: fl.Usage})
			}
		})
		if notes != "" {
			fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(notes))
		}
	}
}

// flagsEnvNote heads every list of flags: each names its variable, or
// says it has none.
const flagsEnvNote = "(each defaults to its environment variable, where it names one, when set)"

func printFlag(w io.Writer, s envFlag) {
	fmt.Fprintf(w, "  --%s\n      %s\n", s.name, s.usage)
	meta := []string{"no environment variable"}
	if s.env != "" {
		meta[0] = "env " + s.env
	}
	if s.def != "" && s.def != "false" {
		meta = append(meta, "default "+s.def)
	}
	fmt.Fprintf(w, "      (%s)\n", strings.Join(meta, ", "))
}

// parse parses args and, for -h or --help, prints the usage to standard
// output (help that was asked for is not an error) and returns
// flag.ErrHelp. A bad flag is reported in one line that points to -h.
//
// Every command takes its flags before or after its other arguments
// ("deepseed job show 7 --server URL" as "deepseed job show --server URL
// 7"); everything after -- is an argument. The arguments are then
// f.fs.Args(). A refused flag (refuse) is reported before anything is
// parsed and without its value: a token given on the command line is
// never echoed back.
func (f *envFlags) parse(args []string) error {
	cmd := strings.TrimPrefix(f.fs.Name(), "deepseed ")
	if err := f.checkRefused(cmd, args); err != nil {
		return err
	}
	f.fs.SetOutput(io.Discard)
	var pos []string
	for {
		err := f.fs.Parse(args)
		switch {
		case errors.Is(err, flag.ErrHelp):
			f.fs.SetOutput(os.Stdout)
			f.fs.Usage()
			return err
		case err != nil:
			hint := ""
			if len(pos) > 0 && strings.HasPrefix(err.Error(), "flag provided but not defined") {
				hint = "; the arguments of a command to run go after --"
			}
			return fmt.Errorf("%s: %w (see %s -h%s)", cmd, err, f.fs.Name(), hint)
		}
		rest := f.fs.Args()
		used := len(args) - len(rest)
		if len(rest) == 0 || (used > 0 && args[used-1] == "--") {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	// Parsing "--" alone leaves the flags as they are and the arguments
	// in f.fs.Args().
	return f.fs.Parse(append([]string{"--"}, pos...))
}

// refuse defines --name as a flag that is not taken, with msg saying what
// to do instead. It is shown in -h; given, the command stops with msg and
// never with the value.
func (f *envFlags) refuse(name, msg string) {
	if f.refused == nil {
		f.refused = map[string]string{}
	}
	f.refused[name] = msg
	f.Func(name, "not taken: "+msg, func(string) error { return errors.New(msg) })
}

// checkRefused returns the error of the first refused flag in args,
// which names the flag and never its value.
func (f *envFlags) checkRefused(cmd string, args []string) error {
	for _, a := range args {
		if a == "--" {
			return nil
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if msg, ok := f.refused[name]; ok {
			return fmt.Errorf("%s: --%s is not taken: %s", cmd, name, msg)
		}
	}
	return nil
}

// configError is the one-line error of a command whose flags are wrong:
// "serve: bad configuration: invalid --role …; invalid --listen …".
func configError(cmd string, errs []error) error {
	msgs := make([]string, 0, len(errs))
	for _, e := range errs {
		msgs = append(msgs, e.Error())
	}
	return fmt.Errorf("%s: bad configuration: %s (see deepseed %s -h)", cmd, strings.Join(msgs, "; "), cmd)
}

// defaultSpoolDir is where the collector keeps its spool unless told:
// /var/lib/deepseed/spool for root (a system service), else the user's
// state directory, $XDG_STATE_HOME/deepseed/spool or
// ~/.local/state/deepseed/spool, which a normal user can write.
func defaultSpoolDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/deepseed/spool"
	}
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "deepseed", "spool")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "state", "deepseed", "spool")
	}
	return "deepseed-spool"
}

// dbFlags are the flags of every command that opens the database.
type dbFlags struct {
	databaseURL, dataDir, localPGPort *string
	timescale, compressAfter          *string
	logLevel, logFormat               *string
}

func addDBFlags(f *envFlags) *dbFlags {
	return &dbFlags{
		databaseURL: f.String("database-url", "DEEPSEED_DATABASE_URL", "",
			"PostgreSQL URL, e.g. postgres://user:pass@host:5432/deepseed; empty starts a private PostgreSQL in --data-dir"),
		dataDir: f.String("data-dir", "DEEPSEED_DATA_DIR", defaultDataDir(),
			"directory of the private PostgreSQL used when no database URL is given; its data is kept across restarts"),
		localPGPort: f.String("local-pg-port", "DEEPSEED_LOCAL_PG_PORT", "5499",
			"127.0.0.1 port of the private PostgreSQL (fixed, so a restart finds its cluster)"),
		timescale: f.String("timescale", "DEEPSEED_TIMESCALE", store.TimescaleAuto,
			"auto: use TimescaleDB where it is installed and preloaded, else plain PostgreSQL (logged, with how to enable it); require: fail without it"),
		compressAfter: f.String("compress-after", "DEEPSEED_COMPRESS_AFTER", "7d",
			"TimescaleDB only: compress time-series chunks older than this"),
		logLevel:  f.String("log-level", "DEEPSEED_LOG_LEVEL", "info", "log level: debug, info, warn or error"),
		logFormat: f.String("log-format", "DEEPSEED_LOG_FORMAT", "text", "log format: text or json"),
	}
}

// defaultDataDir is /var/lib/deepseed for root (a system service, whose
// home the cluster's own user cannot enter), else $XDG_DATA_HOME/deepseed,
// else ~/.local/share/deepseed.
func defaultDataDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/deepseed"
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "deepseed")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "deepseed")
	}
	return "deepseed-data"
}

// dbConfig is the validated form of dbFlags.
type dbConfig struct {
	cmd           string // the command, for its errors
	databaseURL   string
	dataDir       string
	localPGPort   int
	timescale     string
	compressAfter time.Duration
	log           *slog.Logger
}

// parse validates the flags, naming the field of each problem.
func (d *dbFlags) parse(cmd string, w io.Writer) (dbConfig, []error) {
	c := dbConfig{cmd: cmd}
	var errs []error
	bad := func(field, value, msg string) {
		errs = append(errs, &server.FieldError{Field: field, Value: value, Msg: msg})
	}
	c.databaseURL = strings.TrimSpace(*d.databaseURL)
	if c.databaseURL != "" {
		if err := store.CheckURL(c.databaseURL); err != nil {
			// The URL may hold a password: name the field, not the value.
			bad("database-url", "…", "not a valid PostgreSQL URL or DSN")
		}
	}
	c.dataDir = *d.dataDir
	if c.databaseURL == "" && c.dataDir == "" {
		bad("data-dir", "", "needed when no --database-url is given")
	}
	p, err := strconv.Atoi(*d.localPGPort)
	if err != nil || p < 1 || p > 65535 {
		bad("local-pg-port", *d.localPGPort, "want a port from 1 to 65535")
	}
	c.localPGPort = p
	switch c.timescale = *d.timescale; c.timescale {
	case store.TimescaleAuto, store.TimescaleRequire:
	default:
		bad("timescale", c.timescale, "want auto or require")
	}
	if c.compressAfter, err = server.ParseDuration(*d.compressAfter); err != nil {
		bad("compress-after", *d.compressAfter, err.Error())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*d.logLevel)); err != nil {
		bad("log-level", *d.logLevel, "want debug, info, warn or error")
	}
	opts := &slog.HandlerOptions{Level: level}
	switch *d.logFormat {
	case "text":
		c.log = slog.New(slog.NewTextHandler(w, opts))
	case "json":
		c.log = slog.New(slog.NewJSONHandler(w, opts))
	default:
		bad("log-format", *d.logFormat, "want text or json")
	}
	return c, errs
}

// openDatabase opens the store at the configured URL, or starts the
// private PostgreSQL in the data directory and opens its "deepseed"
// database. The returned close function closes the pool and stops the
// private cluster when this process started it; a cluster owned by
// another process (see localpg.Cluster) is used as a client and left
// running.
func openDatabase(ctx context.Context, c dbConfig) (*store.Store, func(), error) {
	url := c.databaseURL
	stop := func() {}
	if url == "" {
		lp := &localpg.Cluster{Dir: filepath.Join(c.dataDir, "postgres"), Port: c.localPGPort, Logger: c.log, Fsync: true}
		c.log.Info("no database URL: using a private PostgreSQL", "dir", lp.Dir, "port", lp.Port)
		admin, err := lp.Start(ctx)
		if err != nil {
			return nil, nil, localPGError(c.cmd, c.localPGPort, err)
		}
		stop = func() {
			if !lp.Owner() {
				return // another process runs the cluster and stops it
			}
			if err := lp.Stop(); err != nil {
				c.log.Error("stop private PostgreSQL", "err", err)
				return
			}
			c.log.Info("private PostgreSQL stopped", "dir", lp.Dir)
		}
		if err := ensureDatabase(ctx, admin, "deepseed"); err != nil {
			stop()
			return nil, nil, err
		}
		url = lp.URL("deepseed")
	}
	st, err := store.Open(ctx, url, c.log.With("component", "store"))
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("open database: %w", err)
	}
	return st, func() { st.Close(); stop() }, nil
}

// ensureDatabase creates database name on the server of adminURL unless it
// exists.
func ensureDatabase(ctx context.Context, adminURL, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := store.EnsureDatabase(ctx, adminURL, name); err != nil {
		return fmt.Errorf("private PostgreSQL: %w", err)
	}
	return nil
}

// wholeAtLeast parses flag name's value v as a whole number of at least
// min; when it is not one, it adds an error naming the flag to errs.
func wholeAtLeast(errs *[]error, name, v string, min int) int {
	n, err := strconv.Atoi(v)
	if err != nil || n < min {
		*errs = append(*errs, fmt.Errorf("--%s %q: want a whole number of at least %d", name, v, min))
	}
	return n
}

// httpFlags are the flags of an HTTP listener's limits, the same for
// serve and collect (see httplimit.Limits).
type httpFlags struct{ maxBody, readHeader, body, maxConns, maxRows, maxInflight *string }

// addHTTPFlags defines them; what names the bodies ("ingest", "hook").
func addHTTPFlags(f *envFlags, what string) *httpFlags {
	d := httplimit.Defaults()
	return &httpFlags{
		maxBody: f.String("max-body-bytes", "DEEPSEED_MAX_BODY_BYTES", strconv.FormatInt(d.MaxBodyBytes, 10),
			"largest "+what+" body accepted, before and after decompression; larger ones get 413"),
		readHeader: f.String("read-header-timeout", "DEEPSEED_READ_HEADER_TIMEOUT", d.ReadHeaderTimeout.String(),
			"how long a client may take to send a request's headers; a slower one is disconnected"),
		body: f.String("body-timeout", "DEEPSEED_BODY_TIMEOUT", d.BodyTimeout.String(),
			"how long a client may take to send a request's body once its headers are in; a slower one gets 408 and is disconnected"),
		maxConns: f.String("max-conns", "DEEPSEED_MAX_CONNS", strconv.Itoa(d.MaxConns),
			"open connections each listener takes; one more is answered 503 with Retry-After and closed"),
		maxRows: f.String("max-batch-rows", "DEEPSEED_MAX_BATCH_ROWS", strconv.Itoa(d.MaxBatchRows),
			"most rows one "+what+" body may expand to (each step of a steps record is a row); a body past it gets 413 and nothing of it is stored"),
		maxInflight: f.String("max-inflight-bytes", "DEEPSEED_MAX_INFLIGHT_BYTES", strconv.FormatInt(d.MaxInflightBytes, 10),
			"memory all requests together may hold (bodies as they arrive, what they decode to, about 1 KiB a row); a body past it waits a second, then gets 503 with Retry-After and nothing of it is stored. Also the Go soft memory limit, plus 64 MiB, unless GOMEMLIMIT is set"),
	}
}

// parse returns the limits, adding a field error for each value that is
// not a number or a duration (Limits.Validate checks the ranges).
func (h *httpFlags) parse(errs *[]error) httplimit.Limits {
	var l httplimit.Limits
	var err error
	if l.MaxBodyBytes, err = strconv.ParseInt(*h.maxBody, 10, 64); err != nil {
		*errs = append(*errs, &server.FieldError{Field: "max-body-bytes", Value: *h.maxBody, Msg: "want a whole number of bytes"})
	}
	if l.ReadHeaderTimeout, err = time.ParseDuration(*h.readHeader); err != nil {
		*errs = append(*errs, &server.FieldError{Field: "read-header-timeout", Value: *h.readHeader, Msg: "want a duration such as 10s"})
	}
	if l.BodyTimeout, err = time.ParseDuration(*h.body); err != nil {
		*errs = append(*errs, &server.FieldError{Field: "body-timeout", Value: *h.body, Msg: "want a duration such as 1m"})
	}
	if l.MaxConns, err = strconv.Atoi(*h.maxConns); err != nil {
		*errs = append(*errs, &server.FieldError{Field: "max-conns", Value: *h.maxConns, Msg: "want a whole number"})
	}
	if l.MaxBatchRows, err = strconv.Atoi(*h.maxRows); err != nil {
		*errs = append(*errs, &server.FieldError{Field: "max-batch-rows", Value: *h.maxRows, Msg: "want a whole number"})
	}
	if l.MaxInflightBytes, err = strconv.ParseInt(*h.maxInflight, 10, 64); err != nil {
		*errs = append(*errs, &server.FieldError{Field: "max-inflight-bytes", Value: *h.maxInflight, Msg: "want a whole number of bytes"})
	}
	return l
}
