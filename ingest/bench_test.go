package ingest_test

import (
	"context"
	"testing"
	"time"

	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/store/storetest"
)

// benchSteps is the steps per batch: 25 steps x 16 ranks x (step + layers)
// is 800 records, about what a collector sends every few seconds.
const benchSteps = 25

func benchLoad(runID string) ingest.Load {
	return ingest.Load{RunID: runID, Ranks: 16, Layers: 26, EvalEvery: 200, Start: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// BenchmarkIngestHTTP posts gzip NDJSON batches to POST /api/v1/ingest:
// HTTP, gunzip, decode, validate, dedupe and the bulk write.
func BenchmarkIngestHTTP(b *testing.B) {
	s := newServer(b, ingest.Options{})
	load := benchLoad("bench-http")
	records := 0
	var elapsed time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		recs := load.Records(int64(i)*benchSteps, benchSteps)
		body, err := ingest.EncodeNDJSON(recs, true)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		r := s.post(b, "/api/v1/ingest", body, "Content-Encoding", "gzip")
		elapsed += time.Since(start)
		if r.Status != 200 {
			b.Fatalf("status %d: %s", r.Status, r.Body)
		}
		records += len(recs)
	}
	b.ReportMetric(float64(records)/elapsed.Seconds(), "records/s")
}

// BenchmarkRawCopy writes the same rows with plain COPY into the same
// tables: the ceiling the ingest path is measured against.
func BenchmarkRawCopy(b *testing.B) {
	st := storetest.NewStore(b)
	load := benchLoad("bench-raw")
	ctx := context.Background()
	records := 0
	var elapsed time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		recs := load.Records(int64(i)*benchSteps, benchSteps)
		b.StartTimer()
		start := time.Now()
		if err := st.CopyRaw(ctx, recs); err != nil {
			b.Fatal(err)
		}
		elapsed += time.Since(start)
		records += len(recs)
	}
	b.ReportMetric(float64(records)/elapsed.Seconds(), "records/s")
}
