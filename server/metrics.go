package server

import (
	"context"
	"log/slog"
	"time"

	vm "github.com/VictoriaMetrics/metrics"
	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/internal/exposition"
	"github.com/deepseed/deepseed/store"
)

// latencyBuckets are the upper bounds, in seconds, of the request-duration
// histogram: from a cached read (under a millisecond) to a large import.
var latencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// serverMetrics is what GET /metrics shows: the HTTP request counters of
// this server, the ingest handler's own metrics, the retention job's
// failures, the database pool and the Go runtime and process, in
// registries the server owns (never process-wide ones, so two servers in
// one process stay apart).
type serverMetrics struct {
	reg *exposition.Registry
	// named holds the series that name runs and projects: shown only to
	// a scrape that sends a valid token, since /metrics itself is public.
	named *exposition.Registry
	// process is the Go runtime's and the process's, written last.
	process  *exposition.Registry
	requests *exposition.CounterVec
	duration *exposition.HistogramVec
	// retentionFailures counts what the retention job could not do: a run
	// it could not drop, another step of a pass, or a whole pass.
	retentionFailures *vm.Counter
}

func newServerMetrics(st *store.Store) *serverMetrics {
	r := exposition.NewRegistry()
	m := &serverMetrics{
		reg:   r,
		named: exposition.NewRegistry(),
		requests: r.CounterVec("deepseed_http_requests_total",
			"HTTP requests answered, by route template, method and status code.", "route", "method", "code"),
		duration: r.HistogramVec("deepseed_http_request_duration_seconds",
			"Time from a request's arrival to its answer, by route template.", latencyBuckets, "route"),
		retentionFailures: r.Counter("deepseed_retention_failures_total",
			"Runs the retention job could not drop, other steps of its passes that failed, and passes that could not run; each is logged."),
		process: exposition.NewRegistry(),
	}
	registerPool(r, st)
	m.process.Writer(exposition.WriteProcess)
	return m
}

// handler answers GET /metrics in the Prometheus text format. Anyone may
// scrape the counts; the series that name runs and projects are added
// only for a scrape with a valid bearer token (of any scope), so an API
// without tokens never shows them. A family that cannot be read (the
// database away) is left out of the scrape and logged.
func (m *serverMetrics) handler(log *slog.Logger, auth *authenticator) echo.HandlerFunc {
	onErr := func(err error) { log.Warn("a /metrics family could not be read", "err", err) }
	public := exposition.Handler(onErr, m.reg, m.process)
	all := exposition.Handler(onErr, m.reg, m.named, m.process)
	return func(c echo.Context) error {
		h := public
		if token, ok := bearerToken(c.Request().Header.Get(echo.HeaderAuthorization)); ok && auth.scope(token) != "" {
			h = all
		}
		h.ServeHTTP(c.Response(), c.Request())
		return nil
	}
}

// registerPool adds the database pool's statistics, read at each scrape.
func registerPool(r *exposition.Registry, st *store.Store) {
	stat := func(typ, name, help string, v func(store.PoolStats) float64) {
		r.Func(name, help, typ, func() (float64, bool) {
			if st == nil {
				return 0, false
			}
			return v(st.PoolStats()), true
		})
	}
	stat("gauge", "deepseed_db_pool_acquired_conns", "Database connections in use by a request.", func(s store.PoolStats) float64 { return float64(s.Acquired) })
	stat("gauge", "deepseed_db_pool_idle_conns", "Database connections open and idle.", func(s store.PoolStats) float64 { return float64(s.Idle) })
	stat("gauge", "deepseed_db_pool_total_conns", "Database connections open, in use, idle or being opened.", func(s store.PoolStats) float64 { return float64(s.Total) })
	stat("gauge", "deepseed_db_pool_constructing_conns", "Database connections being opened.", func(s store.PoolStats) float64 { return float64(s.Constructing) })
	stat("gauge", "deepseed_db_pool_max_conns", "The most database connections the pool opens.", func(s store.PoolStats) float64 { return float64(s.Max) })
	stat("counter", "deepseed_db_pool_acquires_total", "Connections taken from the pool.", func(s store.PoolStats) float64 { return float64(s.Acquires) })
	stat("counter", "deepseed_db_pool_empty_acquires_total", "Connections taken from the pool after waiting, none being idle.", func(s store.PoolStats) float64 { return float64(s.EmptyAcquires) })
	stat("counter", "deepseed_db_pool_canceled_acquires_total", "Waits for a connection given up because the request ended.", func(s store.PoolStats) float64 { return float64(s.CanceledAcquires) })
	stat("counter", "deepseed_db_pool_acquire_wait_seconds_total", "Time spent taking connections from the pool.", func(s store.PoolStats) float64 { return s.AcquireWait.Seconds() })
}

// registerReplica adds, read at each scrape, how far the database the
// query routes read from is behind the primary. It is registered only on
// a server given a read database; the gauge is 0 when that database is
// not a standby, and absent while it does not answer.
func registerReplica(r *exposition.Registry, st *store.Store) {
	r.Func("deepseed_replica_lag_seconds",
		"How far the data of the database the query routes read from is behind the primary's, in seconds (0 when it is not a hot standby).", "gauge",
		func() (float64, bool) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			rep, err := st.Replication(ctx)
			if err != nil {
				return 0, false
			}
			return rep.Lag.Seconds(), true
		})
}
