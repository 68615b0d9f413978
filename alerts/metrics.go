package alerts

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

var (
	openDesc = prometheus.NewDesc("deepseed_alerts_open",
		"Alerts open now, by kind.", []string{"kind"}, nil)
	totalDesc = prometheus.NewDesc("deepseed_alerts_opened_total",
		"Alerts ever opened and still stored, by kind.", []string{"kind"}, nil)
	runOpenDesc = prometheus.NewDesc("deepseed_run_alerts_open",
		"Alerts open now, by run, kind and subject (one series per open alert).", []string{"run_id", "project", "kind", "subject"}, nil)
)

// Collector shows the alerts table on a Prometheus registry, read at each
// scrape (a small aggregate over the alerts table): counts by kind, which
// name no run or project.
type Collector struct{ Store *store.Store }

// RunCollector shows one series per open alert, naming its run and
// project: for scrapers that hold a token (see server's /metrics).
type RunCollector struct{ Store *store.Store }

// Describe implements prometheus.Collector.
func (Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- openDesc
	ch <- totalDesc
}

// Describe implements prometheus.Collector.
func (RunCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- runOpenDesc
}

// Collect implements prometheus.Collector. A database that does not
// answer leaves the alert metrics out of this scrape.
func (c Collector) Collect(ch chan<- prometheus.Metric) {
	if c.Store == nil || c.Store.Pool == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := c.Store.Pool.Query(ctx, `SELECT kind, count(*) FILTER (WHERE resolved_at IS NULL), count(*) FROM alerts GROUP BY kind`)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(openDesc, err)
		return
	}
	seen := map[string]bool{}
	for rows.Next() {
		var kind string
		var open, total float64
		if err := rows.Scan(&kind, &open, &total); err != nil {
			rows.Close()
			ch <- prometheus.NewInvalidMetric(openDesc, err)
			return
		}
		seen[kind] = true
		ch <- prometheus.MustNewConstMetric(openDesc, prometheus.GaugeValue, open, kind)
		ch <- prometheus.MustNewConstMetric(totalDesc, prometheus.CounterValue, total, kind)
	}
	rows.Close()
	for _, k := range api.AlertKinds {
		if !seen[k] {
			ch <- prometheus.MustNewConstMetric(openDesc, prometheus.GaugeValue, 0, k)
			ch <- prometheus.MustNewConstMetric(totalDesc, prometheus.CounterValue, 0, k)
		}
	}
}

// Collect implements prometheus.Collector. A database that does not
// answer leaves the series out of this scrape.
func (c RunCollector) Collect(ch chan<- prometheus.Metric) {
	if c.Store == nil || c.Store.Pool == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := c.Store.Pool.Query(ctx, `SELECT a.run_id, coalesce(r.project, ''), a.kind, a.subject FROM alerts a
		LEFT JOIN runs r USING (run_id) WHERE a.resolved_at IS NULL ORDER BY a.run_id, a.kind, a.subject LIMIT 1000`)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(runOpenDesc, err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var run, project, kind, subject string
		if err := rows.Scan(&run, &project, &kind, &subject); err != nil {
			ch <- prometheus.NewInvalidMetric(runOpenDesc, err)
			return
		}
		ch <- prometheus.MustNewConstMetric(runOpenDesc, prometheus.GaugeValue, 1, run, project, kind, subject)
	}
}
