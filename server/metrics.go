package server

import (
	"context"
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/deepseed/deepseed/store"
)

// latencyBuckets are the upper bounds, in seconds, of the request-duration
// histogram: from a cached read (under a millisecond) to a large import.
var latencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// serverMetrics is what GET /metrics shows: the HTTP request counters of
// this server, the ingest handler's own metrics, the retention job's
// failures, the database pool and the Go runtime and process, in a
// registry the server owns (never the process-wide default one, so two
// servers in one process stay apart).
type serverMetrics struct {
	reg *prometheus.Registry
	// named holds the series that name runs and projects: shown only to
	// a scrape that sends a valid token, since /metrics itself is public.
	named    *prometheus.Registry
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	// retentionFailures counts what the retention job could not do: a run
	// it could not drop, another step of a pass, or a whole pass.
	retentionFailures prometheus.Counter
}

func newServerMetrics(st *store.Store) *serverMetrics {
	m := &serverMetrics{
		reg:   prometheus.NewRegistry(),
		named: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "deepseed_http_requests_total",
			Help: "HTTP requests answered, by route template, method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "deepseed_http_request_duration_seconds",
			Help:    "Time from a request's arrival to its answer, by route template.",
			Buckets: latencyBuckets,
		}, []string{"route"}),
		retentionFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "deepseed_retention_failures_total",
			Help: "Runs the retention job could not drop, other steps of its passes that failed, and passes that could not run; each is logged.",
		}),
	}
	m.reg.MustRegister(m.requests, m.duration, m.retentionFailures, poolCollector{st},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// handler answers GET /metrics in the Prometheus text format (or another
// exposition format the scraper asks for). Anyone may scrape the counts;
// the series that name runs and projects are added only for a scrape
// with a valid bearer token (of any scope), so an API without tokens
// never shows them.
func (m *serverMetrics) handler(log *slog.Logger, auth *authenticator) echo.HandlerFunc {
	opts := promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
	}
	public := promhttp.HandlerFor(m.reg, opts)
	all := promhttp.HandlerFor(prometheus.Gatherers{m.reg, m.named}, opts)
	return func(c echo.Context) error {
		h := public
		if token, ok := bearerToken(c.Request().Header.Get(echo.HeaderAuthorization)); ok && auth.scope(token) != "" {
			h = all
		}
		h.ServeHTTP(c.Response(), c.Request())
		return nil
	}
}

// poolCollector reads the database pool's statistics at each scrape.
type poolCollector struct{ st *store.Store }

var (
	poolAcquired     = poolDesc("deepseed_db_pool_acquired_conns", "Database connections in use by a request.")
	poolIdle         = poolDesc("deepseed_db_pool_idle_conns", "Database connections open and idle.")
	poolTotal        = poolDesc("deepseed_db_pool_total_conns", "Database connections open, in use, idle or being opened.")
	poolConstructing = poolDesc("deepseed_db_pool_constructing_conns", "Database connections being opened.")
	poolMax          = poolDesc("deepseed_db_pool_max_conns", "The most database connections the pool opens.")
	poolAcquires     = poolDesc("deepseed_db_pool_acquires_total", "Connections taken from the pool.")
	poolEmpty        = poolDesc("deepseed_db_pool_empty_acquires_total", "Connections taken from the pool after waiting, none being idle.")
	poolCanceled     = poolDesc("deepseed_db_pool_canceled_acquires_total", "Waits for a connection given up because the request ended.")
	poolWait         = poolDesc("deepseed_db_pool_acquire_wait_seconds_total", "Time spent taking connections from the pool.")
)

func poolDesc(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }

func (poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolAcquired, poolIdle, poolTotal, poolConstructing, poolMax, poolAcquires, poolEmpty, poolCanceled, poolWait} {
		ch <- d
	}
}

func (p poolCollector) Collect(ch chan<- prometheus.Metric) {
	if p.st == nil {
		return
	}
	s := p.st.PoolStats()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge(poolAcquired, float64(s.Acquired))
	gauge(poolIdle, float64(s.Idle))
	gauge(poolTotal, float64(s.Total))
	gauge(poolConstructing, float64(s.Constructing))
	gauge(poolMax, float64(s.Max))
	counter(poolAcquires, float64(s.Acquires))
	counter(poolEmpty, float64(s.EmptyAcquires))
	counter(poolCanceled, float64(s.CanceledAcquires))
	counter(poolWait, s.AcquireWait.Seconds())
}

// replicaCollector reads, at each scrape, how far the database the query
// routes read from is behind the primary. It is registered only on a
// server given a read database; the gauge is 0 when that database is not
// a standby, and absent while it does not answer.
type replicaCollector struct{ st *store.Store }

var replicaLag = prometheus.NewDesc("deepseed_replica_lag_seconds",
	"How far the data of the database the query routes read from is behind the primary's, in seconds (0 when it is not a hot standby).", nil, nil)

func (replicaCollector) Describe(ch chan<- *prometheus.Desc) { ch <- replicaLag }

func (r replicaCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rep, err := r.st.Replication(ctx)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(replicaLag, prometheus.GaugeValue, rep.Lag.Seconds())
}
