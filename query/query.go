// Package query serves the read API under /api/v1 and holds the
// computations behind every chart: downsampling, heatmap buckets,
// steady-state windows, breakdowns and comparisons. It reads through the
// store's methods and holds no SQL.
//
// Usage:
//  1. h := query.New(store, query.Options{Logger: log})
//  2. h.Register(e.Group("/api/v1")) — GET /runs, /runs/:id, …, /compare,
//     /gpus, /annotations.
//
// Every answer is one of the api package's response types; a run that does
// not exist is a 404 and a bad parameter a 400 naming it, both as
// [api.Error].
package query

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/detect"
	"github.com/deepseed/deepseed/internal/httplimit"
	"github.com/deepseed/deepseed/store"
)

// Options configures the query handlers.
type Options struct {
	Logger *slog.Logger
	// StragglerPct is the default margin over the median step time past
	// which a rank is flagged as a straggler; 0 means 10.
	StragglerPct float64
	// Timeout bounds the database work of one request; 0 means 30s.
	Timeout time.Duration
	// Primary, when set and not the store New was given, is the primary
	// database and the handler's store a hot standby of it: rollups are
	// refreshed on the primary before reads from the standby, and answers
	// about running runs say how far the standby is behind.
	Primary *store.Store
	// ReplayWait bounds how long a read waits for the standby to replay a
	// refresh made on the primary; 0 means 2s.
	ReplayWait time.Duration
	// RefreshBudget bounds the rollup refresh a read makes itself before
	// it answers from the rollups as they are; 0 means 10s.
	RefreshBudget time.Duration
	// Alerts is the detectors' configuration, whose straggler score the
	// ranks of a run the evaluator never scored are given; nil means
	// detect.Defaults().
	Alerts *detect.Config
}

// Handler serves the query routes.
type Handler struct {
	store *store.Store
	opt   Options
	log   *slog.Logger
	// behindUntil (Unix nanoseconds) is set when the standby did not
	// replay a refresh within ReplayWait: until then reads do not wait
	// for it again. primaryAwayUntil is set when the primary was
	// unavailable: until then reads do not refresh (see refreshRollups).
	behindUntil, primaryAwayUntil atomic.Int64
}

// New returns the query handlers over s.
func New(s *store.Store, opt Options) *Handler {
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.StragglerPct <= 0 {
		opt.StragglerPct = 10
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 30 * time.Second
	}
	if opt.ReplayWait <= 0 {
		opt.ReplayWait = defaultReplayWait
	}
	if opt.RefreshBudget <= 0 {
		opt.RefreshBudget = defaultRefreshBudget
	}
	return &Handler{store: s, opt: opt, log: opt.Logger}
}

// Register adds the GET routes to g (mounted at /api/v1).
func (h *Handler) Register(g *echo.Group) {
	g.GET("/runs", h.wrap(h.listRuns))
	g.GET("/runs/:id", h.wrap(h.getRun))
	g.GET("/runs/:id/series", h.wrap(h.series))
	g.GET("/runs/:id/heatmap", h.wrap(h.heatmap))
	g.GET("/runs/:id/evals", h.wrap(h.evals))
	g.GET("/runs/:id/breakdown", h.wrap(h.breakdown))
	g.GET("/runs/:id/memory", h.wrap(h.memory))
	g.GET("/runs/:id/ranks", h.wrap(h.ranks))
	g.GET("/runs/:id/code", h.wrap(h.code))
	g.GET("/runs/:id/regression", h.wrap(h.regression))
	g.GET("/runs/:id/ledger", h.wrap(h.runLedger))
	g.GET("/ledger", h.wrap(h.projectLedger))
	g.GET("/compare", h.wrap(h.compare))
	g.GET("/gpus", h.wrap(h.gpus))
	g.GET("/annotations", h.wrap(h.annotations))
	g.GET("/alerts", h.wrap(h.alerts))
}

// Routes lists the paths Register adds, for API documents and tests.
var Routes = []string{
	"/runs", "/runs/:id", "/runs/:id/series", "/runs/:id/heatmap", "/runs/:id/evals",
	"/runs/:id/breakdown", "/runs/:id/memory", "/runs/:id/ranks", "/compare", "/gpus", "/annotations",
	"/alerts", "/runs/:id/regression", "/runs/:id/ledger", "/ledger",
}

// badParam is a 400 naming the query parameter at fault.
type badParam struct{ param, msg string }

func (e *badParam) Error() string { return e.param + ": " + e.msg }

func bad(param, format string, args ...any) error {
	return &badParam{param: param, msg: fmt.Sprintf(format, args...)}
}

// notFound is a 404.
type notFound struct{ what string }

func (e *notFound) Error() string { return e.what + " not found" }

type handlerFunc func(ctx context.Context, c echo.Context) (any, error)

// wrap gives every handler a deadline and turns its errors into api.Error
// answers: 400 for bad parameters, 404 for unknown runs, 503 when the
// database cannot be reached, 500 otherwise (logged once, here).
func (h *Handler) wrap(f handlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		ctx, cancel := context.WithTimeout(c.Request().Context(), h.opt.Timeout)
		defer cancel()
		ctx, lag := withLagNote(ctx)
		v, err := f(ctx, c)
		if err == nil {
			lag.setHeaders(c)
			return c.JSON(http.StatusOK, v)
		}
		var bp *badParam
		var nf *notFound
		switch {
		case errors.As(err, &bp):
			return c.JSON(http.StatusBadRequest, api.Error{Error: bp.Error(), Param: bp.param})
		case errors.As(err, &nf):
			return c.JSON(http.StatusNotFound, api.Error{Error: nf.Error()})
		case store.IsUnavailable(err):
			h.log.Warn("query: database unavailable", "path", c.Path(), "err", err)
			c.Response().Header().Set("Retry-After", "5")
			msg := "database unavailable"
			if store.IsReadOnly(err) {
				// A standby where the primary belongs (or a failover under
				// way): the read needed a rollup refresh it refuses.
				msg = "database unavailable: it is a read-only standby"
			}
			return c.JSON(http.StatusServiceUnavailable, api.Error{Error: msg})
		}
		if httplimit.ClientGone(c.Request()) {
			// Nobody waits for the answer: not a failure of the server.
			h.log.Debug("query: the client went away", "path", c.Path(), "err", err)
			return c.JSON(httplimit.StatusClientClosedRequest, api.Error{Error: "the client closed the request"})
		}
		h.log.Error("query failed", "path", c.Path(), "err", err)
		return c.JSON(http.StatusInternalServerError, api.Error{Error: "internal error"})
	}
}

// --- parameters ---

func intParam(c echo.Context, name string, def, lo, hi int64) (int64, error) {
	s := c.QueryParam(name)
	if s == "" {
		return def, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, bad(name, "want an integer, got %q", s)
	}
	if v < lo || v > hi {
		return 0, bad(name, "must be between %d and %d", lo, hi)
	}
	return v, nil
}

func optIntParam(c echo.Context, name string, lo, hi int64) (*int64, error) {
	if c.QueryParam(name) == "" {
		return nil, nil
	}
	v, err := intParam(c, name, 0, lo, hi)
	if err != nil {
		return nil, err
	}
	return &v, nil
}

func boolParam(c echo.Context, name string) (bool, error) {
	s := c.QueryParam(name)
	if s == "" {
		return false, nil
	}
	v, err := strconv.ParseBool(s)
	if err != nil {
		return false, bad(name, "want true or false, got %q", s)
	}
	return v, nil
}

func timeParam(c echo.Context, name string, def time.Time) (time.Time, error) {
	s := c.QueryParam(name)
	if s == "" {
		return def, nil
	}
	// Grafana sends epoch milliseconds; accept those beside RFC 3339 and
	// Unix seconds.
	if v, err := strconv.ParseInt(s, 10, 64); err == nil && v > 1e11 {
		return time.UnixMilli(v).UTC(), nil
	}
	t, err := api.ParseTime(s)
	if err != nil {
		return time.Time{}, bad(name, "%v", err)
	}
	return t, nil
}

// multiParam returns the values of a repeatable parameter, also split on
// commas.
func multiParam(c echo.Context, name string) []string {
	var out []string
	for _, v := range c.QueryParams()[name] {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// run loads the run named by the :id path parameter, or a 404.
func (h *Handler) run(ctx context.Context, c echo.Context) (*store.RunRow, error) {
	id := c.Param("id")
	r, err := h.store.GetRun(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, &notFound{what: fmt.Sprintf("run %q", id)}
	}
	return r, err
}

// rankParam reads rank (default: the lowest rank of the run, which is 0
// for every ordinary run).
func (h *Handler) rankParam(ctx context.Context, c echo.Context, runID string) (int, error) {
	if c.QueryParam("rank") == "" {
		ranks, err := h.store.RunRanks(ctx, runID)
		if err != nil {
			return 0, err
		}
		if len(ranks) > 0 {
			return ranks[0], nil
		}
		return 0, nil
	}
	v, err := intParam(c, "rank", 0, 0, api.MaxRank)
	return int(v), err
}

// --- helpers for figures ---

func fp(v *float64) *api.Float {
	if v == nil {
		return nil
	}
	f := api.Float(*v)
	return &f
}

func fv(v float64) *api.Float { f := api.Float(v); return &f }

func scale(v *float64, k float64) *float64 {
	if v == nil {
		return nil
	}
	x := *v * k
	return &x
}

// metricUnits gives the unit of each built-in metric: the step table's
// series (api.StepFields) and the per-rank series.
var metricUnits = func() map[string]string {
	units := map[string]string{"lateness_ms": "ms", "straggler_score": "ratio"}
	for _, sf := range api.StepFields {
		if sf.Sum != api.StepStored && sf.Unit != "" {
			units[sf.Name] = sf.Unit
		}
	}
	return units
}()

// gpuUnit gives the unit of a GPU metric, as the metric table defines it.
func gpuUnit(metric string) string {
	if m := api.GPUMetricNamed(metric); m != nil {
		return m.Unit
	}
	return ""
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
