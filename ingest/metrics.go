package ingest

import (
	"io"

	vm "github.com/VictoriaMetrics/metrics"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/exposition"
)

// writeBuckets are the upper bounds, in seconds, of the batch write-time
// histogram, up to writeTimeout.
var writeBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// metrics are one Handler's counters, in a registry of their own that
// the server writes on /metrics (see [Handler.WriteMetrics]).
type metrics struct {
	reg        *exposition.Registry
	records    *exposition.CounterVec
	rejected   *exposition.CounterVec
	duplicates *vm.Counter
	write      *vm.PrometheusHistogram
	// combineFallbacks counts combined writes that failed and were
	// written again batch by batch.
	combineFallbacks *vm.Counter
	// combinedBatches counts batches written together with others.
	combinedBatches *vm.Counter
}

func newMetrics() *metrics {
	r := exposition.NewRegistry()
	m := &metrics{
		reg:     r,
		records: r.CounterVec("deepseed_ingest_records_total", "Records stored, by kind (duplicates not counted).", "kind"),
		rejected: r.CounterVec("deepseed_ingest_rejected_total",
			`Batches refused with 400, by the kind of the record at fault ("unknown" when it had none, "body" when the body was unreadable or the database refused a value).`, "kind"),
		duplicates: r.Counter("deepseed_ingest_duplicates_total", "Records already stored, dropped as duplicates (retries, resumed runs)."),
		write: r.Histogram("deepseed_db_write_duration_seconds",
			"Time to write one ingested batch to the database, waiting for a writer included.", writeBuckets),
		combineFallbacks: r.Counter("deepseed_ingest_combine_fallbacks_total",
			"Combined writes of several batches that failed and were written again batch by batch."),
		combinedBatches: r.Counter("deepseed_ingest_combined_batches_total", "Batches written in one transaction together with others."),
	}
	// Every kind shows from the start, at 0, so that rates and alerts see
	// the first record of a kind as an increase.
	for _, k := range api.Kinds {
		m.records.With(k)
		m.rejected.With(k)
	}
	m.rejected.With("unknown")
	m.rejected.With("body")
	return m
}

// rejectedTotal counts rejected batches by the kind of the record at
// fault ("unknown" when it had none, "body" for unreadable bodies).
func (m *metrics) rejectedTotal(kind string) *vm.Counter {
	if kind == "" || !knownKind(kind) {
		kind = "unknown"
	}
	return m.rejected.With(kind)
}

func knownKind(k string) bool {
	for _, v := range api.Kinds {
		if v == k {
			return true
		}
	}
	return k == "body"
}

// WriteMetrics writes the handler's families in the Prometheus text
// format; the server's /metrics includes them.
func (h *Handler) WriteMetrics(w io.Writer) error { return h.m.reg.Write(w) }
