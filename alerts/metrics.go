package alerts

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
	if c.Store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	counts, err := c.Store.AlertCounts(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(openDesc, err)
		return
	}
	seen := map[string]bool{}
	for _, r := range counts {
		seen[r.Kind] = true
		ch <- prometheus.MustNewConstMetric(openDesc, prometheus.GaugeValue, r.Open, r.Kind)
		ch <- prometheus.MustNewConstMetric(totalDesc, prometheus.CounterValue, r.Total, r.Kind)
	}
	for _, k := range kindsList() {
		if !seen[k] {
			ch <- prometheus.MustNewConstMetric(openDesc, prometheus.GaugeValue, 0, k)
			ch <- prometheus.MustNewConstMetric(totalDesc, prometheus.CounterValue, 0, k)
		}
	}
}

// Collect implements prometheus.Collector. A database that does not
// answer leaves the series out of this scrape.
func (c RunCollector) Collect(ch chan<- prometheus.Metric) {
	if c.Store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	open, err := c.Store.OpenAlerts(ctx, 1000)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(runOpenDesc, err)
		return
	}
	for _, a := range open {
		ch <- prometheus.MustNewConstMetric(runOpenDesc, prometheus.GaugeValue, 1, a.RunID, a.Project, a.Kind, a.Subject)
	}
}
