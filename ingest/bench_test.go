package ingest_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/internal/fleettest"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// benchSteps is the steps per batch: 25 steps x 16 ranks x (step + layers)
// is 800 records, about what a collector sends every few seconds.
const benchSteps = 25

// benchConns are the concurrent senders each benchmark runs with: one, a
// collector waiting for each answer, and four, as `deepseed bench ingest`
// runs by default. Each sender plays its own run, as each node's collector
// does.
var benchConns = []int{1, 4}

func benchLoad(runID string) fleettest.Load {
	return fleettest.Load{RunID: runID, Ranks: 16, Layers: 26, EvalEvery: 200, Start: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// benchBatches returns the records of b.N batches spread over conns runs
// named prefix-0, prefix-1…, each run's batches in step order, built before
// the clock starts. Both benchmarks build every batch up front and collect
// the garbage of building them, so that neither pays for the test's own
// work (JSON encoding and gzip are several times the server's cost) while
// it is timed.
func benchBatches(b *testing.B, prefix string, conns int) [][][]api.Record {
	batches := make([][][]api.Record, conns)
	for i := 0; i < b.N; i++ {
		c := i % conns
		load := benchLoad(fmt.Sprintf("%s-%d", prefix, c))
		batches[c] = append(batches[c], load.Records(int64(len(batches[c]))*benchSteps, benchSteps))
	}
	return batches
}

// runConns times send over every batch, one goroutine per sender, each
// sending its own batches in order, and reports records/s.
func runConns[T any](b *testing.B, batches [][]T, size func(T) int, send func(T) error) {
	// Every benchmark starts from a clean checkpoint, so that none pays
	// for the dirty pages of the one before it.
	conn, err := pgx.Connect(context.Background(), storetest.AdminURL(b))
	if err != nil {
		b.Fatal(err)
	}
	_, err = conn.Exec(context.Background(), "CHECKPOINT")
	conn.Close(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		records  int
	)
	for _, list := range batches {
		for _, x := range list {
			records += size(x)
		}
	}
	b.ResetTimer()
	start := time.Now()
	for _, list := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, x := range list {
				if err := send(x); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	b.ReportMetric(float64(records)/elapsed.Seconds(), "records/s")
}

// BenchmarkIngestHTTP posts gzip NDJSON batches to POST /api/v1/ingest:
// HTTP, gunzip, decode, validate, dedupe and the bulk write.
func BenchmarkIngestHTTP(b *testing.B) {
	for _, conns := range benchConns {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			s := newServer(b, ingest.Options{})
			type body struct {
				gz      []byte
				records int
			}
			batches := benchBatches(b, "bench-http", conns)
			bodies := make([][]body, conns)
			for c, list := range batches {
				for _, recs := range list {
					gz, err := ingest.EncodeNDJSON(recs, true)
					if err != nil {
						b.Fatal(err)
					}
					bodies[c] = append(bodies[c], body{gz, len(recs)})
				}
			}
			batches = nil
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns}}
			runConns(b, bodies, func(x body) int { return x.records }, func(x body) error {
				req, err := http.NewRequest(http.MethodPost, s.URL+"/api/v1/ingest", bytes.NewReader(x.gz))
				if err != nil {
					return err
				}
				req.Header.Set("Content-Type", "application/x-ndjson")
				req.Header.Set("Content-Encoding", "gzip")
				res, err := client.Do(req)
				if err != nil {
					return err
				}
				msg, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					return fmt.Errorf("status %d: %s", res.StatusCode, msg)
				}
				return nil
			})
		})
	}
}

// BenchmarkRawCopy writes the same rows with plain COPY into the same
// tables: the ceiling the ingest path is measured against.
func BenchmarkRawCopy(b *testing.B) {
	benchStore(b, "bench-raw", func(ctx context.Context, st *store.Store, recs []api.Record) error {
		return st.CopyRaw(ctx, recs)
	})
}

// BenchmarkWriteBatch writes the same batches through the store's write
// path without HTTP or decoding: what the bookkeeping (run locks, dedupe
// probes, rollup markers) costs over BenchmarkRawCopy.
func BenchmarkWriteBatch(b *testing.B) {
	benchStore(b, "bench-write", func(ctx context.Context, st *store.Store, recs []api.Record) error {
		_, err := st.WriteBatch(ctx, recs)
		return err
	})
}

// benchStore times write over the benchmark's batches on a fresh store,
// for each number of senders.
func benchStore(b *testing.B, prefix string, write func(context.Context, *store.Store, []api.Record) error) {
	for _, conns := range benchConns {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			st := storetest.NewStore(b)
			ctx := context.Background()
			runConns(b, benchBatches(b, prefix, conns), func(x []api.Record) int { return len(x) },
				func(x []api.Record) error { return write(ctx, st, x) })
		})
	}
}
