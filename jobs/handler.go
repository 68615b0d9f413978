// Package jobs serves the job, sweep, quota and agent routes under
// /api/v1 and keeps the job queue honest: jobs whose agent has gone
// silent are marked lost (and retried when they have retries left).
//
// Usage:
//  1. h := jobs.New(store, jobs.Options{Logger: log})
//  2. h.Register(e.Group("/api/v1")) — the routes; Scopes says which
//     token scope each writing route needs.
//  3. go h.Reap(ctx) — the lost-job reaper, until ctx is cancelled.
//
// Jobs are never run through a shell: argv items are substituted
// ({name} → the parameter's value) and the parameters are given as
// environment variables too.
package jobs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// Token scopes of the writing routes (the server's authenticator reads
// Scopes).
const (
	ScopeSubmit = "submit"
	ScopeAgent  = "agent"
)

// Scopes maps "METHOD path" of each writing route to the scope its token
// needs. Reading routes need any token.
var Scopes = map[string]string{
	"POST /api/v1/jobs":                   ScopeSubmit,
	"POST /api/v1/jobs/:id/cancel":        ScopeSubmit,
	"POST /api/v1/sweeps":                 ScopeSubmit,
	"PUT /api/v1/quotas/:project":         ScopeSubmit,
	"POST /api/v1/agents/:name/heartbeat": ScopeAgent,
	"POST /api/v1/agents/:name/claim":     ScopeAgent,
	"POST /api/v1/agents/:name/jobs/:id":  ScopeAgent,
}

// Options configures the handlers.
type Options struct {
	Logger *slog.Logger
	// HeartbeatTimeout is the silence after which an agent's jobs are
	// lost; 0 means 60s. Agents beat every third of it.
	HeartbeatTimeout time.Duration
	// Timeout bounds the database work of one request; 0 means 30s.
	Timeout time.Duration
	// MaxGPUs bounds the GPUs one job may ask for; 0 means 64.
	MaxGPUs int
}

// Handler serves the routes.
type Handler struct {
	store *store.Store
	opt   Options
	log   *slog.Logger

	// over caches the projects over quota for claims, for a second.
	mu     sync.Mutex
	over   []string
	overAt time.Time
}

// New returns the handlers over s.
func New(s *store.Store, opt Options) *Handler {
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.HeartbeatTimeout <= 0 {
		opt.HeartbeatTimeout = 60 * time.Second
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 30 * time.Second
	}
	if opt.MaxGPUs <= 0 {
		opt.MaxGPUs = 64
	}
	return &Handler{store: s, opt: opt, log: opt.Logger}
}

// Register adds the routes to g (mounted at /api/v1).
func (h *Handler) Register(g *echo.Group) {
	g.POST("/jobs", h.wrap(h.submit))
	g.GET("/jobs", h.wrap(h.list))
	g.GET("/jobs/:id", h.wrap(h.show))
	g.POST("/jobs/:id/cancel", h.wrap(h.cancel))
	g.POST("/sweeps", h.wrap(h.createSweep))
	g.GET("/sweeps", h.wrap(h.listSweeps))
	g.GET("/sweeps/:id", h.wrap(h.showSweep))
	g.GET("/quotas", h.wrap(h.listQuotas))
	g.GET("/quotas/:project", h.wrap(h.showQuota))
	g.PUT("/quotas/:project", h.wrap(h.setQuota))
	g.GET("/agents", h.wrap(h.listAgents))
	g.POST("/agents/:name/heartbeat", h.wrap(h.heartbeat))
	g.POST("/agents/:name/claim", h.wrap(h.claim))
	g.POST("/agents/:name/jobs/:id", h.wrap(h.report))
}

type handlerFunc func(ctx context.Context, c echo.Context) (int, any, error)

// wrap gives each handler a deadline and turns its errors into api.Error
// answers: 400 for bad input (naming the field), 403 for a report on
// another agent's job, 404, 409, 422, and 503
// when the database is away.
func (h *Handler) wrap(fn handlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		ctx, cancel := context.WithTimeout(c.Request().Context(), h.opt.Timeout)
		defer cancel()
		code, body, err := fn(ctx, c)
		if err == nil {
			return c.JSON(code, body)
		}
		var ie *inputError
		var he *httpError
		switch {
		case errors.As(err, &ie):
			return echo.NewHTTPError(http.StatusBadRequest, api.Error{Error: ie.Error(), Param: ie.field})
		case errors.As(err, &he):
			return echo.NewHTTPError(he.code, api.Error{Error: he.msg})
		case errors.Is(err, store.ErrNotFound):
			return echo.NewHTTPError(http.StatusNotFound, api.Error{Error: err.Error()})
		case errors.Is(err, store.ErrNotHeld):
			return echo.NewHTTPError(http.StatusForbidden, api.Error{Error: err.Error()})
		case errors.Is(err, store.ErrConflict):
			return echo.NewHTTPError(http.StatusConflict, api.Error{Error: err.Error()})
		case store.IsUnavailable(err) || errors.Is(err, context.DeadlineExceeded):
			c.Response().Header().Set("Retry-After", "1")
			return echo.NewHTTPError(http.StatusServiceUnavailable, api.Error{Error: "database unavailable, retry later"}).SetInternal(err)
		}
		return echo.NewHTTPError(http.StatusInternalServerError, api.Error{Error: "internal server error"}).SetInternal(err)
	}
}

// httpError is an answer with its own status.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func status(code int, format string, args ...any) error {
	return &httpError{code: code, msg: fmt.Sprintf(format, args...)}
}

// decode reads a JSON body of at most 1 MiB into v, refusing unknown
// fields and trailing data.
func decode(c echo.Context, v any) error {
	r := io.LimitReader(c.Request().Body, 1<<20+1)
	b, err := io.ReadAll(r)
	if err != nil {
		return bad("body", "could not read it: %v", err)
	}
	if len(b) > 1<<20 {
		return status(http.StatusRequestEntityTooLarge, "the body is larger than 1 MiB")
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return bad("body", "not the expected JSON object: %v", err)
	}
	if d.More() {
		return bad("body", "data after the JSON object")
	}
	if f, ok := nulField(reflect.ValueOf(v)); ok {
		return bad(strings.TrimPrefix(f, "."), "holds a NUL byte (\\u0000), which cannot be stored")
	}
	return nil
}

// nulField finds the first string of a decoded body (a field, an item or
// a map key or value) that holds a NUL byte, which PostgreSQL's text
// refuses, and returns its path (".argv[1]", ".params key"). The path is
// built only on the way back from a hit.
func nulField(v reflect.Value) (string, bool) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return nulField(v.Elem())
		}
	case reflect.String:
		return "", strings.IndexByte(v.String(), 0) >= 0
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if f, ok := nulField(v.Index(i)); ok {
				return fmt.Sprintf("[%d]", i) + f, true
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			if _, ok := nulField(it.Key()); ok {
				return " key", true
			}
			if f, ok := nulField(it.Value()); ok {
				return "." + fmt.Sprint(it.Key().Interface()) + f, true
			}
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			if f, ok := nulField(v.Field(i)); ok {
				name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
				if name == "" {
					name = t.Field(i).Name
				}
				return "." + name + f, true
			}
		}
	}
	return "", false
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidName reports whether s can name a project or an agent: letters,
// digits, '.', '_' and '-', at most 128, starting with a letter or digit.
func ValidName(s string) bool { return namePattern.MatchString(s) }

func checkProject(p string) error {
	if p == "" {
		return bad("project", "missing: every job belongs to a project")
	}
	if !namePattern.MatchString(p) {
		return bad("project", "%q: letters, digits, '.', '_' and '-', at most 128, starting with a letter or digit", p)
	}
	return nil
}

func idParam(c echo.Context) (int64, error) {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, bad("id", "%q is not a job id (a positive number)", c.Param("id"))
	}
	return id, nil
}

func newSweepID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "sw-" + hex.EncodeToString(b)
}

// checkGPUs refuses a job asking for more GPUs than any agent serving the
// project has (422), so it would never start.
func (h *Handler) checkGPUs(ctx context.Context, project string, gpus int) error {
	if gpus < 1 || gpus > h.opt.MaxGPUs {
		return bad("gpus", "%d: want 1 to %d", gpus, h.opt.MaxGPUs)
	}
	most, agents, err := h.store.MostAgentGPUs(ctx, project)
	if err != nil {
		return err
	}
	if agents == 0 {
		return status(http.StatusUnprocessableEntity, "no agent serves project %s: start deepseed agent on a GPU node first", project)
	}
	if gpus > most {
		return status(http.StatusUnprocessableEntity, "no agent serving project %s has %d GPUs: the most any has is %d", project, gpus, most)
	}
	return nil
}

// quotaCheck refuses the submission with 409 when the project has used
// its GPU hours; it runs inside the transaction that queues the jobs.
func quotaCheck(project string) store.JobCheck {
	return func(ctx context.Context, tx store.JobTx) error {
		u, err := tx.Usage(ctx, []string{project})
		if err != nil {
			return err
		}
		if q := u[project]; q.Exceeded {
			return status(http.StatusConflict, "quota exceeded: %s of %g GPU-hours used", hours(q.UsedGPUHours), *q.GPUHours)
		}
		return nil
	}
}

func (h *Handler) submit(ctx context.Context, c echo.Context) (int, any, error) {
	var in api.JobSubmit
	if err := decode(c, &in); err != nil {
		return 0, nil, err
	}
	if err := checkQueued(in.Project, in.Argv, &in.GPUs, in.Retries); err != nil {
		return 0, nil, err
	}
	if err := checkParams(in.Argv, in.Params, checkValue); err != nil {
		return 0, nil, err
	}
	if err := h.checkGPUs(ctx, in.Project, in.GPUs); err != nil {
		return 0, nil, err
	}
	js, err := h.store.CreateJobs(ctx, []store.NewJob{{
		Project: in.Project, Argv: substitute(in.Argv, in.Params), Params: in.Params, GPUs: in.GPUs, Retries: in.Retries,
	}}, quotaCheck(in.Project))
	if err != nil {
		return 0, nil, err
	}
	h.log.Info("job queued", "job", js[0].ID, "project", in.Project, "gpus", in.GPUs)
	return http.StatusCreated, js[0], nil
}

func (h *Handler) list(ctx context.Context, c echo.Context) (int, any, error) {
	f := store.JobFilter{Project: c.QueryParam("project"), SweepID: c.QueryParam("sweep"),
		State: c.QueryParam("state"), Agent: c.QueryParam("agent")}
	for name, v := range map[string]string{"project": f.Project, "sweep": f.SweepID, "agent": f.Agent} {
		if len(v) > api.MaxIDLen {
			return 0, nil, bad(name, "longer than %d bytes", api.MaxIDLen)
		}
	}
	switch f.State {
	case "", store.JobQueued, store.JobRunning, store.JobFinished, store.JobFailed, store.JobCancelled, store.JobLost:
	default:
		return 0, nil, bad("state", "%q is not queued, running, finished, failed, cancelled or lost", f.State)
	}
	var err error
	if f.Limit, err = limitParam(c); err != nil {
		return 0, nil, err
	}
	list, counts, err := h.store.Jobs(ctx, f)
	if err != nil {
		return 0, nil, err
	}
	if list == nil {
		list = []api.Job{}
	}
	return http.StatusOK, api.JobList{Jobs: list, Counts: counts, Limit: f.Limit}, nil
}

// limitParam reads ?limit of a list: 1 to 1000, 100 when absent.
func limitParam(c echo.Context) (int, error) {
	s := c.QueryParam("limit")
	if s == "" {
		return 100, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 1000 {
		return 0, bad("limit", "%q: want 1 to 1000", s)
	}
	return n, nil
}

func (h *Handler) show(ctx context.Context, c echo.Context) (int, any, error) {
	id, err := idParam(c)
	if err != nil {
		return 0, nil, err
	}
	j, err := h.store.Job(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil, fmt.Errorf("job %d: %w", id, err)
	}
	return http.StatusOK, j, err
}

func (h *Handler) cancel(ctx context.Context, c echo.Context) (int, any, error) {
	id, err := idParam(c)
	if err != nil {
		return 0, nil, err
	}
	j, err := h.store.CancelJob(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil, fmt.Errorf("job %d: %w", id, err)
	}
	if err != nil {
		return 0, nil, err
	}
	h.log.Info("job cancel requested", "job", id, "state", j.State)
	return http.StatusOK, j, nil
}

// hours writes GPU-hours with one decimal, or three significant digits
// below 1 so that a small quota's usage is not shown as 0.0.
func hours(h float64) string {
	if h >= 1 {
		return strconv.FormatFloat(h, 'f', 1, 64)
	}
	return strconv.FormatFloat(h, 'g', 3, 64)
}
