package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/store"
)

// BenchCommand holds the load tools; "bench ingest" is the one so far.
type BenchCommand struct{}

const benchNotes = `
Each connection plays one training run (--ranks ranks, --layers layers, an
evaluation every --eval-every steps) and posts gzip NDJSON batches of
--steps-per-batch steps to POST /api/v1/ingest, one after the other, for
--duration. The batches are encoded before the clock starts, so the figure
is the server's. With --database-url the same rows are then written with a
plain COPY into the same tables (scratch runs, same connections, same
duration, batches also built beforehand), once the server has refreshed
the rollups of the HTTP phase's runs, and the ratio of the two rates is
printed. A phase also ends when its --max-records are all sent. Both sets of scratch
runs are deleted afterwards unless --keep is given.`

// Run implements command.
func (c *BenchCommand) Run(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "ingest" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fmt.Fprintln(os.Stderr, "Usage: deepseed bench ingest [flags]   (deepseed bench ingest -h for the flags)")
			return nil
		}
		return errors.New(`bench: want "deepseed bench ingest [flags]"`)
	}
	args = args[1:]
	f := newEnvFlags("bench ingest")
	server := f.String("server", "DEEPSEED_SERVER_URL", "http://localhost:8080", "DeepSeed server base URL")
	token := f.String("token", "DEEPSEED_TOKEN", "", "ingest token, sent as Authorization: Bearer")
	dbURL := f.String("database-url", "DEEPSEED_DATABASE_URL", "", "database of that server: also measure a raw COPY of the same rows, and clean up")
	conns := f.String("connections", "DEEPSEED_BENCH_CONNECTIONS", "4", "concurrent senders, one run each")
	duration := f.String("duration", "DEEPSEED_BENCH_DURATION", "20s", "how long each phase runs")
	stepsPer := f.String("steps-per-batch", "DEEPSEED_BENCH_STEPS_PER_BATCH", "25", "steps per batch; a step is one step and one layers record per rank")
	ranks := f.String("ranks", "", "16", "ranks per run")
	layers := f.String("layers", "", "26", "layers per model")
	evalEvery := f.String("eval-every", "", "200", "steps between evaluations")
	maxRecords := f.String("max-records", "", "600000", "most records built ahead of each phase (bounds memory)")
	keep := f.fs.Bool("keep", false, "keep the scratch runs instead of deleting them")
	f.setUsage("deepseed bench ingest [flags]", "Post realistic batches and report records/s, against a raw COPY of the same rows.", benchNotes)
	if err := f.fs.Parse(args); err != nil {
		return err
	}
	var errs []error
	num := func(name, v string, min int) int {
		n, err := strconv.Atoi(v)
		if err != nil || n < min {
			errs = append(errs, fmt.Errorf("--%s %q: want a whole number of at least %d", name, v, min))
		}
		return n
	}
	nConns := num("connections", *conns, 1)
	nSteps := num("steps-per-batch", *stepsPer, 1)
	nRanks := num("ranks", *ranks, 1)
	nLayers := num("layers", *layers, 2)
	nEval := num("eval-every", *evalEvery, 0)
	nMax := num("max-records", *maxRecords, 1)
	dur, err := time.ParseDuration(*duration)
	if err != nil || dur <= 0 {
		errs = append(errs, fmt.Errorf("--duration %q: want a duration such as 20s", *duration))
	}
	base, err := url.Parse(strings.TrimRight(*server, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		errs = append(errs, fmt.Errorf("--server %q: want an http(s) URL", *server))
	}
	if len(errs) > 0 {
		return errors.Join(append([]error{errors.New("bench ingest: bad flags")}, errs...)...)
	}
	target := base.JoinPath("/api/v1/ingest").String()

	tag := randomTag()
	t0 := time.Now().UTC().Add(-24 * time.Hour).Truncate(time.Second)
	loads := make([]ingest.Load, nConns)
	for i := range loads {
		loads[i] = ingest.Load{RunID: fmt.Sprintf("bench-http-%s-%d", tag, i), Ranks: nRanks, Layers: nLayers, EvalEvery: nEval, Start: t0}
	}
	perBatch := len(loads[0].Records(1, int64(nSteps)))
	batchesPerConn := max(1, nMax/perBatch/nConns)

	// Encode every batch first: the client's JSON and gzip work must not
	// eat the CPU the server is measured on when both share a machine.
	fmt.Fprintf(os.Stderr, "encoding %d batches of %d records for %d connections…\n", batchesPerConn*nConns, perBatch, nConns)
	bodies := make([][][]byte, nConns)
	counts := make([][]int, nConns)
	for c := range loads {
		for b := 0; b < batchesPerConn; b++ {
			recs := loads[c].Records(int64(b*nSteps), int64(nSteps))
			body, err := ingest.EncodeNDJSON(recs, true)
			if err != nil {
				return fmt.Errorf("bench ingest: %w", err)
			}
			bodies[c] = append(bodies[c], body)
			counts[c] = append(counts[c], len(recs))
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	httpRecs, httpTime, err := runPhase(ctx, nConns, dur, func(ctx context.Context, c, b int) (int, error) {
		if b >= len(bodies[c]) {
			return 0, errExhausted
		}
		res, err := postWithRetry(ctx, target, *token, bodies[c][b])
		if err != nil {
			return 0, err
		}
		if res.Accepted+res.Duplicates != counts[c][b] {
			return 0, fmt.Errorf("server answered %d accepted + %d duplicates for %d records", res.Accepted, res.Duplicates, counts[c][b])
		}
		return counts[c][b], nil
	})
	if err != nil {
		return fmt.Errorf("bench ingest: http: %w", err)
	}
	httpRate := float64(httpRecs) / httpTime.Seconds()
	fmt.Printf("http ingest: %d records in %.1fs = %.0f records/s (%d connections, %d records a batch, gzip NDJSON)\n",
		httpRecs, httpTime.Seconds(), httpRate, nConns, perBatch)
	if *dbURL == "" {
		return nil
	}

	st, err := store.Open(ctx, *dbURL, nil)
	if err != nil {
		return fmt.Errorf("bench ingest: %w", err)
	}
	defer st.Close()
	raws := make([]ingest.Load, nConns)
	var scratch, httpRuns []string
	for i := range raws {
		raws[i] = loads[i]
		raws[i].RunID = fmt.Sprintf("bench-raw-%s-%d", tag, i)
		scratch = append(scratch, loads[i].RunID, raws[i].RunID)
		httpRuns = append(httpRuns, loads[i].RunID)
	}
	// The server refreshes the rollups of what the HTTP phase wrote in the
	// background; let it finish, so that the raw phase does not share the
	// database with work the HTTP phase caused.
	if waited, err := waitRollups(ctx, st, httpRuns, 2*time.Minute, 10*time.Second); err != nil {
		return fmt.Errorf("bench ingest: %w", err)
	} else if waited > time.Second {
		fmt.Fprintf(os.Stderr, "waited %.0fs for the server to refresh the HTTP runs' rollups…\n", waited.Seconds())
	}
	// Like the HTTP bodies, the raw batches are built before the clock
	// starts, so that neither phase pays for the tool's own work.
	bodies = nil
	rawBatches := make([][][]api.Record, nConns)
	for c := range raws {
		for b := 0; b < batchesPerConn; b++ {
			rawBatches[c] = append(rawBatches[c], raws[c].Records(int64(b*nSteps), int64(nSteps)))
		}
	}
	runtime.GC()
	rawRecs, rawTime, err := runPhase(ctx, nConns, dur, func(ctx context.Context, c, b int) (int, error) {
		if b >= len(rawBatches[c]) {
			return 0, errExhausted
		}
		recs := rawBatches[c][b]
		if err := st.CopyRaw(ctx, recs); err != nil {
			return 0, err
		}
		return len(recs), nil
	})
	if err != nil {
		return fmt.Errorf("bench ingest: raw copy: %w", err)
	}
	rawRate := float64(rawRecs) / rawTime.Seconds()
	fmt.Printf("raw COPY:    %d records in %.1fs = %.0f records/s (same rows, same tables, %d connections)\n",
		rawRecs, rawTime.Seconds(), rawRate, nConns)
	fmt.Printf("ratio:       %.0f %% of raw COPY\n", 100*httpRate/rawRate)
	if !*keep {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer ccancel()
		if err := st.DeleteRuns(cctx, scratch); err != nil {
			return fmt.Errorf("bench ingest: clean up: %w", err)
		}
	}
	return nil
}

var errExhausted = errors.New("no more encoded batches")

// waitRollups waits until no rollup of runs is marked stale, for at most
// limit, and returns how long it waited. A server of role ingest refreshes
// no rollups, so when the markers stay as they are for stall the wait
// ends early: nothing is working on them.
func waitRollups(ctx context.Context, st *store.Store, runs []string, limit, stall time.Duration) (time.Duration, error) {
	start := time.Now()
	last, lastChange := int64(-1), start
	for time.Since(start) < limit {
		var dirty int64
		if err := st.Pool.QueryRow(ctx, `SELECT count(*) FROM rollup_dirty WHERE run_id = ANY($1)`, runs).Scan(&dirty); err != nil {
			return 0, fmt.Errorf("wait for rollups: %w", err)
		}
		if dirty == 0 {
			break
		}
		if dirty != last {
			last, lastChange = dirty, time.Now()
		} else if time.Since(lastChange) >= stall {
			break
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return time.Since(start), nil
}

// runPhase runs send on conns goroutines, each with its own batch counter,
// until the duration is up (or a sender runs out of batches), and returns
// the records sent and the time taken.
func runPhase(ctx context.Context, conns int, d time.Duration, send func(ctx context.Context, c, b int) (int, error)) (int, time.Duration, error) {
	var total atomic.Int64
	var firstErr error
	var once, errOnce sync.Once
	stop := make(chan struct{})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	timer := time.AfterFunc(d, func() { once.Do(func() { close(stop) }) })
	defer timer.Stop()
	var wg sync.WaitGroup
	for c := 0; c < conns; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := 0; ; b++ {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				n, err := send(ctx, c, b)
				if errors.Is(err, errExhausted) {
					once.Do(func() { close(stop) })
					return
				}
				if err != nil {
					if ctx.Err() == nil {
						errOnce.Do(func() { firstErr = err })
					}
					cancel()
					return
				}
				total.Add(int64(n))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return 0, 0, firstErr
	}
	if err := ctx.Err(); err != nil && total.Load() == 0 {
		return 0, 0, err
	}
	return int(total.Load()), elapsed, nil
}

func randomTag() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
