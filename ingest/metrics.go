package ingest

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/deepseed/deepseed/api"
)

// writeBuckets are the upper bounds, in seconds, of the batch write-time
// histogram, up to writeTimeout.
var writeBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// metrics are one Handler's counters. The Handler is a
// [prometheus.Collector] of them: the server registers it with the
// registry that answers /metrics.
type metrics struct {
	records    *prometheus.CounterVec
	rejected   *prometheus.CounterVec
	duplicates prometheus.Counter
	write      prometheus.Histogram
	// combineFallbacks counts combined writes that failed and were
	// written again batch by batch.
	combineFallbacks prometheus.Counter
	// combinedBatches counts batches written together with others.
	combinedBatches prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "deepseed_ingest_records_total",
			Help: "Records stored, by kind (duplicates not counted).",
		}, []string{"kind"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "deepseed_ingest_rejected_total",
			Help: `Batches refused with 400, by the kind of the record at fault ("unknown" when it had none, "body" when the body was unreadable or the database refused a value).`,
		}, []string{"kind"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "deepseed_ingest_duplicates_total",
			Help: "Records already stored, dropped as duplicates (retries, resumed runs).",
		}),
		write: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "deepseed_db_write_duration_seconds",
			Help:    "Time to write one ingested batch to the database, waiting for a writer included.",
			Buckets: writeBuckets,
		}),
		combineFallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "deepseed_ingest_combine_fallbacks_total",
			Help: "Combined writes of several batches that failed and were written again batch by batch.",
		}),
		combinedBatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "deepseed_ingest_combined_batches_total",
			Help: "Batches written in one transaction together with others.",
		}),
	}
	// Every kind shows from the start, at 0, so that rates and alerts see
	// the first record of a kind as an increase.
	for _, k := range api.Kinds {
		m.records.WithLabelValues(k)
		m.rejected.WithLabelValues(k)
	}
	m.rejected.WithLabelValues("unknown")
	m.rejected.WithLabelValues("body")
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.records, m.rejected, m.duplicates, m.write, m.combineFallbacks, m.combinedBatches}
}

// rejectedTotal counts rejected batches by the kind of the record at
// fault ("unknown" when it had none, "body" for unreadable bodies).
func (m *metrics) rejectedTotal(kind string) prometheus.Counter {
	if kind == "" || !knownKind(kind) {
		kind = "unknown"
	}
	return m.rejected.WithLabelValues(kind)
}

func knownKind(k string) bool {
	for _, v := range api.Kinds {
		if v == k {
			return true
		}
	}
	return k == "body"
}

// Describe implements [prometheus.Collector].
func (h *Handler) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range h.m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements [prometheus.Collector].
func (h *Handler) Collect(ch chan<- prometheus.Metric) {
	for _, c := range h.m.collectors() {
		c.Collect(ch)
	}
}
