package ingest_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/store/storetest"
)

// benchSteps is the steps per batch: 25 steps x 16 ranks x (step + layers)
// is 800 records, about what a collector sends every few seconds.
const benchSteps = 25

func benchLoad(runID string) ingest.Load {
	return ingest.Load{RunID: runID, Ranks: 16, Layers: 26, EvalEvery: 200, Start: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// benchBatches returns the records of b.N batches of load, built before the
// clock starts. Both benchmarks build every batch up front and collect the
// garbage of building them, so that neither pays for the test's own work
// (JSON encoding and gzip are several times the server's cost) while it is
// timed.
func benchBatches(b *testing.B, load ingest.Load) [][]api.Record {
	batches := make([][]api.Record, b.N)
	for i := range batches {
		batches[i] = load.Records(int64(i)*benchSteps, benchSteps)
	}
	return batches
}

// BenchmarkIngestHTTP posts gzip NDJSON batches to POST /api/v1/ingest:
// HTTP, gunzip, decode, validate, dedupe and the bulk write.
func BenchmarkIngestHTTP(b *testing.B) {
	s := newServer(b, ingest.Options{})
	batches := benchBatches(b, benchLoad("bench-http"))
	bodies := make([][]byte, len(batches))
	for i, recs := range batches {
		body, err := ingest.EncodeNDJSON(recs, true)
		if err != nil {
			b.Fatal(err)
		}
		bodies[i] = body
	}
	records := 0
	runtime.GC()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		r := s.post(b, "/api/v1/ingest", bodies[i], "Content-Encoding", "gzip")
		if r.Status != 200 {
			b.Fatalf("status %d: %s", r.Status, r.Body)
		}
		records += len(batches[i])
	}
	b.ReportMetric(float64(records)/time.Since(start).Seconds(), "records/s")
}

// BenchmarkRawCopy writes the same rows with plain COPY into the same
// tables: the ceiling the ingest path is measured against.
func BenchmarkRawCopy(b *testing.B) {
	st := storetest.NewStore(b)
	batches := benchBatches(b, benchLoad("bench-raw"))
	ctx := context.Background()
	records := 0
	runtime.GC()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if err := st.CopyRaw(ctx, batches[i]); err != nil {
			b.Fatal(err)
		}
		records += len(batches[i])
	}
	b.ReportMetric(float64(records)/time.Since(start).Seconds(), "records/s")
}
