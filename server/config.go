package server

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/deepseed/deepseed/detect"
	"github.com/deepseed/deepseed/internal/httplimit"
)

// Roles a server can take. Ingest and query replicas can run apart; "all"
// serves both from one process.
const (
	RoleAll    = "all"
	RoleIngest = "ingest"
	RoleQuery  = "query"
)

// Config is what a server needs besides its store. The serve command fills
// it from flags and environment variables; Validate checks it in one place.
type Config struct {
	// Listen is the TCP address of the HTTP API, e.g. ":8080". With no
	// token configured it must be a loopback address unless InsecureOpen.
	Listen string
	// InsecureOpen allows an API with no token on a non-loopback address:
	// anyone who reaches it reads and writes every run.
	InsecureOpen bool
	// Role selects the routes: all, ingest or query.
	Role string
	// HTTP bounds what clients can make the server hold: body size,
	// header and body deadlines, open connections.
	HTTP httplimit.Limits
	// IngestTokens may write and read; ReadTokens may only read. With
	// neither set the API is open.
	IngestTokens []string
	ReadTokens   []string
	// SubmitTokens may queue and cancel jobs and set quotas; AgentTokens
	// may claim jobs and report on them (package jobs), each as the agents
	// it names only (NAME:TOKEN, see ParseAgentToken). Both may read. The
	// job routes that start processes need them even when the API is
	// otherwise open.
	SubmitTokens []string
	AgentTokens  []string
	// JobHeartbeatTimeout is the silence of an agent after which its
	// jobs are lost (and retried when they have retries left).
	JobHeartbeatTimeout time.Duration
	// StragglerPct is the default straggler margin of GET /runs/{id}/ranks.
	StragglerPct float64
	// ShutdownTimeout bounds how long in-flight requests may take to
	// finish after shutdown begins.
	ShutdownTimeout time.Duration
	// Retention drops runs whose last activity is older than it, and GPU
	// and host samples of no run older than it (see store.ApplyRetention;
	// both database modes); 0 keeps everything.
	Retention time.Duration
	// RetentionEvery is how often the retention job runs; 0 means hourly.
	RetentionEvery time.Duration
	// CompressAfter compresses chunks older than it (TimescaleDB only).
	CompressAfter time.Duration
	// Timescale is store.TimescaleAuto or store.TimescaleRequire.
	Timescale string
	// AlertsEvery is how often the detectors run (package alerts); 0
	// means every 5 seconds, a negative value turns them off.
	AlertsEvery time.Duration
	// Alerts holds the detectors' default thresholds; a run's meta
	// overrides them (see detect.Config).
	Alerts detect.Config
}

// DefaultConfig returns the defaults the serve command starts from.
func DefaultConfig() Config {
	return Config{
		Listen:          loopbackListen,
		Role:            RoleAll,
		HTTP:            httplimit.Defaults(),
		StragglerPct:    10,
		ShutdownTimeout: 30 * time.Second,
		CompressAfter:   7 * 24 * time.Hour,
		Timescale:       "auto",
		AlertsEvery:     5 * time.Second,
		Alerts:          detect.Defaults(),

		JobHeartbeatTimeout: 60 * time.Second,
	}
}

// The API's addresses unless told: every interface when tokens guard it,
// loopback only when none does.
const (
	loopbackListen = "127.0.0.1:8080"
	networkListen  = ":8080"
)

// DefaultListen returns where the API listens unless told: loopback only
// when no token is configured (c.Open), every interface otherwise.
func (c Config) DefaultListen() string {
	if c.Open() {
		return loopbackListen
	}
	return networkListen
}

// IsLoopback reports whether the listen address addr (host:port) takes
// connections from this machine only: a loopback IP or "localhost". An
// empty host (":8080") is every interface.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// FieldError says which configuration field is wrong.
type FieldError struct {
	Field string // the flag name, e.g. "listen"
	Value string
	Msg   string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("invalid --%s %q: %s", e.Field, e.Value, e.Msg)
}

// Validate checks every field and returns all problems joined, each a
// [*FieldError] naming its flag.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, value, msg string) {
		errs = append(errs, &FieldError{Field: field, Value: value, Msg: msg})
	}
	if _, port, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen", c.Listen, "want host:port or :port")
	} else if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		bad("listen", c.Listen, "port must be a number from 0 to 65535")
	} else if c.Open() && !c.InsecureOpen && !IsLoopback(c.Listen) {
		bad("listen", c.Listen, "no token is configured, so anyone who reaches this address could read and write every run: "+
			"set DEEPSEED_INGEST_TOKENS and DEEPSEED_READ_TOKENS, listen on loopback (127.0.0.1:8080), "+
			"or pass --insecure-open (DEEPSEED_INSECURE_OPEN=1) to serve it open anyway")
	}
	switch c.Role {
	case RoleAll, RoleIngest, RoleQuery:
	default:
		bad("role", c.Role, "want all, ingest or query")
	}
	c.HTTP.Validate(bad)
	if c.StragglerPct <= 0 || c.StragglerPct > 1000 {
		bad("straggler-pct", strconv.FormatFloat(c.StragglerPct, 'g', -1, 64), "must be above 0 and at most 1000")
	}
	if c.ShutdownTimeout <= 0 {
		bad("shutdown-timeout", c.ShutdownTimeout.String(), "must be positive")
	}
	if c.Retention < 0 {
		bad("retention", FormatDuration(c.Retention), "must be 0 (keep) or positive")
	}
	if c.CompressAfter <= 0 {
		bad("compress-after", FormatDuration(c.CompressAfter), "must be positive")
	}
	if c.Retention > 0 && c.Retention < time.Hour {
		bad("retention", FormatDuration(c.Retention), "must be 0 (keep) or at least 1h")
	}
	if c.JobHeartbeatTimeout < time.Second {
		bad("job-heartbeat-timeout", c.JobHeartbeatTimeout.String(), "must be at least 1s")
	}
	for i, e := range c.AgentTokens {
		if _, _, _, err := ParseAgentToken(e); err != nil {
			errs = append(errs, fmt.Errorf("DEEPSEED_AGENT_TOKENS: entry %d: %w", i+1, err))
		}
	}
	switch c.Timescale {
	case "", "auto", "require":
	default:
		bad("timescale", c.Timescale, "want auto or require")
	}
	return errors.Join(errs...)
}

// Open reports whether no token is configured, so the API needs none.
func (c Config) Open() bool {
	return len(c.IngestTokens) == 0 && len(c.ReadTokens) == 0 && len(c.SubmitTokens) == 0 && len(c.AgentTokens) == 0
}

// SplitTokens splits a comma-separated token list, dropping blanks.
func SplitTokens(s string) []string {
	var out []string
	for _, t := range strings.Split(s, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// ParseDuration parses a Go duration ("36h", "90m") or a whole number of
// days or weeks ("90d", "2w"); "0" is zero.
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" {
		return 0, nil
	}
	for suffix, unit := range map[string]time.Duration{"d": 24 * time.Hour, "w": 7 * 24 * time.Hour} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			v, err := strconv.ParseFloat(n, 64)
			if err != nil || v < 0 {
				return 0, fmt.Errorf("want a duration such as 90d, 36h or 0, got %q", s)
			}
			return time.Duration(v * float64(unit)), nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("want a duration such as 90d, 36h or 0, got %q", s)
	}
	return d, nil
}

// FormatDuration writes d in whole days when it is one, else as Go does.
func FormatDuration(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	if d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	return d.String()
}
