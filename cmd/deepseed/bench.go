package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/internal/fleettest"
	"github.com/deepseed/deepseed/internal/stats"
	"github.com/deepseed/deepseed/store"
)

// BenchCommand holds the load tools: "bench ingest", "bench chaos", "bench query" and "bench collector".
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
printed. A phase also ends when its --max-records are all sent.

The two phases alternate for --rounds rounds, each on new runs, so that
both see the database at the same sizes and the same background work
(checkpoints, autovacuum); the summary gives the median of each rate and
of the rounds' ratios. Before each phase the tool asks for a CHECKPOINT,
which needs a superuser or pg_checkpoint; without one it goes on. The
scratch runs are deleted at the end unless --keep is given.`

// Run implements command.
func (c *BenchCommand) Run(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "chaos" {
		return runChaos(ctx, args[1:])
	}
	if len(args) > 0 && args[0] == "query" {
		return benchQuery(ctx, args[1:])
	}
	if len(args) > 0 && args[0] == "collector" {
		return runCollectorBench(ctx, args[1:])
	}
	if len(args) == 0 || args[0] != "ingest" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fmt.Fprintln(os.Stdout, "Usage: deepseed bench ingest [flags]   (deepseed bench ingest -h for the flags)")
			fmt.Fprintln(os.Stdout, "       deepseed bench chaos [flags]    (deepseed bench chaos -h for the flags)")
			fmt.Fprintln(os.Stdout, "       deepseed bench query [flags]    (deepseed bench query -h for the flags)")
			fmt.Fprintln(os.Stdout, "       deepseed bench collector [flags] (deepseed bench collector -h for the flags)")
			return nil
		}
		return errors.New(`bench: want "deepseed bench ingest [flags]", "deepseed bench chaos [flags]", "deepseed bench query [flags]" or "deepseed bench collector [flags]"`)
	}
	args = args[1:]
	f := newEnvFlags("bench ingest")
	server := f.String("server", "DEEPSEED_SERVER_URL", "http://localhost:8080", "DeepSeed server base URL")
	tok := addTokenFlag(f, ingestToken)
	dbURL := f.String("database-url", "DEEPSEED_DATABASE_URL", "", "database of that server: also measure a raw COPY of the same rows, and clean up")
	conns := f.String("connections", "DEEPSEED_BENCH_CONNECTIONS", "4", "concurrent senders, one run each")
	duration := f.String("duration", "DEEPSEED_BENCH_DURATION", "20s", "how long each phase runs")
	rounds := f.String("rounds", "DEEPSEED_BENCH_ROUNDS", "3", "rounds of an HTTP phase followed by a raw COPY phase")
	stepsPer := f.String("steps-per-batch", "DEEPSEED_BENCH_STEPS_PER_BATCH", "25", "steps per batch; a step is one step and one layers record per rank")
	ranks := f.String("ranks", "", "16", "ranks per run")
	layers := f.String("layers", "", "26", "layers per model")
	evalEvery := f.String("eval-every", "", "200", "steps between evaluations")
	maxRecords := f.String("max-records", "", "600000", "most records built ahead of each phase (bounds memory)")
	keep := f.Bool("keep", "", false, "keep the scratch runs instead of deleting them")
	perRank := f.Bool("per-rank", "", false, "one run whose --ranks ranks each post their own --rate step records a second")
	rate := f.String("rate", "", "10", "with --per-rank: step records each rank posts per second, in one request")
	f.setUsage("deepseed bench ingest [flags]", "Post realistic batches and report records/s, against a raw COPY of the same rows.", benchNotes+"\n"+perRankNotes)
	if err := f.parse(args); err != nil {
		return err
	}
	token, err := tok.value()
	if err != nil {
		return fmt.Errorf("bench ingest: %w", err)
	}
	var errs []error
	num := func(name, v string, min int) int { return wholeAtLeast(&errs, name, v, min) }
	cfg := benchConfig{
		conns:     num("connections", *conns, 1),
		rounds:    num("rounds", *rounds, 1),
		steps:     num("steps-per-batch", *stepsPer, 1),
		ranks:     num("ranks", *ranks, 1),
		layers:    num("layers", *layers, 2),
		evalEvery: num("eval-every", *evalEvery, 0),
		token:     token,
	}
	nMax := num("max-records", *maxRecords, 1)
	dur, err := time.ParseDuration(*duration)
	if err != nil || dur <= 0 {
		errs = append(errs, fmt.Errorf("--duration %q: want a duration such as 20s", *duration))
	}
	cfg.duration = dur
	base, err := serverURL(*server)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return configError("bench ingest", errs)
	}
	cfg.target = base.JoinPath("/api/v1/ingest").String()
	cfg.tag = randomTag()
	if *perRank {
		perSec := num("rate", *rate, 1)
		return benchPerRank(ctx, perRankBench{target: cfg.target, token: cfg.token, ranks: cfg.ranks,
			rate: perSec, duration: dur, runID: "bench-ranks-" + cfg.tag,
			start: time.Now().UTC().Add(-time.Hour).Truncate(time.Second)}, *dbURL, *keep, errs)
	}
	cfg.start = time.Now().UTC().Add(-24 * time.Hour).Truncate(time.Second)
	cfg.perBatch = len(cfg.load("x").Records(1, int64(cfg.steps)))
	cfg.batchesPerConn = max(1, nMax/cfg.perBatch/cfg.conns)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var st *store.Store
	if *dbURL != "" {
		if st, err = store.Open(ctx, *dbURL, nil); err != nil {
			return fmt.Errorf("bench ingest: %w", err)
		}
		defer st.Close()
	}
	var scratch []string
	defer func() {
		if st == nil || *keep || len(scratch) == 0 {
			return
		}
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer ccancel()
		fmt.Fprintf(os.Stderr, "deleting %d scratch runs…\n", len(scratch))
		if err := st.DeleteRuns(cctx, scratch); err != nil {
			fmt.Fprintf(os.Stderr, "bench ingest: clean up: %v\n", err)
		}
	}()

	cp := &checkpointer{st: st}
	var httpRates, rawRates, ratios []float64
	for r := 1; r <= cfg.rounds; r++ {
		httpRuns := cfg.runIDs("http", r)
		scratch = append(scratch, httpRuns...)
		cp.run(ctx)
		n, d, err := cfg.httpPhase(ctx, httpRuns)
		if err != nil {
			return fmt.Errorf("bench ingest: round %d: http: %w", r, err)
		}
		httpRate := float64(n) / d.Seconds()
		httpRates = append(httpRates, httpRate)
		fmt.Printf("round %d  http ingest: %d records in %.1fs = %.0f records/s (%d connections, %d records a batch, gzip NDJSON)\n",
			r, n, d.Seconds(), httpRate, cfg.conns, cfg.perBatch)
		if st == nil {
			continue
		}
		// The server refreshes the rollups of what the HTTP phase wrote in
		// the background; let it finish, so that the raw phase does not
		// share the database with work the HTTP phase caused.
		if err := waitRollups(ctx, st, httpRuns, 2*time.Minute, 15*time.Second); err != nil {
			return fmt.Errorf("bench ingest: %w", err)
		}
		rawRuns := cfg.runIDs("raw", r)
		scratch = append(scratch, rawRuns...)
		cp.run(ctx)
		n, d, err = cfg.rawPhase(ctx, st, rawRuns)
		if err != nil {
			return fmt.Errorf("bench ingest: round %d: raw copy: %w", r, err)
		}
		rawRate := float64(n) / d.Seconds()
		rawRates = append(rawRates, rawRate)
		ratios = append(ratios, httpRate/rawRate)
		fmt.Printf("round %d  raw COPY:    %d records in %.1fs = %.0f records/s (same rows, same tables, %d connections)\n",
			r, n, d.Seconds(), rawRate, cfg.conns)
		fmt.Printf("round %d  ratio:       %.0f %% of raw COPY\n", r, 100*httpRate/rawRate)
	}
	fmt.Printf("http ingest: %.0f records/s (median of %d rounds)\n", stats.Median(httpRates), len(httpRates))
	if st != nil {
		fmt.Printf("raw COPY:    %.0f records/s (median of %d rounds)\n", stats.Median(rawRates), len(rawRates))
		fmt.Printf("ratio:       %.0f %% of raw COPY (median of the rounds' ratios)\n", 100*stats.Median(ratios))
	}
	return nil
}

// benchConfig is one load test's shape and target.
type benchConfig struct {
	conns, rounds, steps, ranks, layers, evalEvery int
	perBatch, batchesPerConn                       int
	duration                                       time.Duration
	target, token, tag                             string
	start                                          time.Time
}

func (c benchConfig) load(runID string) fleettest.Load {
	return fleettest.Load{RunID: runID, Ranks: c.ranks, Layers: c.layers, EvalEvery: c.evalEvery, Start: c.start}
}

// runIDs names the scratch runs of one phase of one round, a run per
// connection.
func (c benchConfig) runIDs(phase string, round int) []string {
	ids := make([]string, c.conns)
	for i := range ids {
		ids[i] = fmt.Sprintf("bench-%s-%s-r%d-%d", phase, c.tag, round, i)
	}
	return ids
}

// httpPhase encodes every batch of runs first (the client's JSON and gzip
// work must not eat the CPU the server is measured on when both share a
// machine), then posts them.
func (c benchConfig) httpPhase(ctx context.Context, runs []string) (int, time.Duration, error) {
	fmt.Fprintf(os.Stderr, "encoding %d batches of %d records for %d connections…\n", c.batchesPerConn*c.conns, c.perBatch, c.conns)
	bodies := make([][][]byte, c.conns)
	counts := make([][]int, c.conns)
	for i, id := range runs {
		load := c.load(id)
		for b := 0; b < c.batchesPerConn; b++ {
			recs := load.Records(int64(b*c.steps), int64(c.steps))
			body, err := ingest.EncodeNDJSON(recs, true)
			if err != nil {
				return 0, 0, err
			}
			bodies[i] = append(bodies[i], body)
			counts[i] = append(counts[i], len(recs))
		}
	}
	runtime.GC()
	return runPhase(ctx, c.conns, c.duration, func(ctx context.Context, conn, b int) (int, error) {
		if b >= len(bodies[conn]) {
			return 0, errExhausted
		}
		res, err := postWithRetry(ctx, c.target, c.token, bodies[conn][b])
		if err != nil {
			return 0, err
		}
		if res.Accepted+res.Duplicates != counts[conn][b] {
			return 0, fmt.Errorf("server answered %d accepted + %d duplicates for %d records", res.Accepted, res.Duplicates, counts[conn][b])
		}
		return counts[conn][b], nil
	})
}

// rawPhase builds the same rows for runs before the clock starts, like the
// HTTP bodies, and writes them with a plain COPY.
func (c benchConfig) rawPhase(ctx context.Context, st *store.Store, runs []string) (int, time.Duration, error) {
	batches := make([][][]api.Record, c.conns)
	for i, id := range runs {
		load := c.load(id)
		for b := 0; b < c.batchesPerConn; b++ {
			batches[i] = append(batches[i], load.Records(int64(b*c.steps), int64(c.steps)))
		}
	}
	runtime.GC()
	return runPhase(ctx, c.conns, c.duration, func(ctx context.Context, conn, b int) (int, error) {
		if b >= len(batches[conn]) {
			return 0, errExhausted
		}
		recs := batches[conn][b]
		if err := st.CopyRaw(ctx, recs); err != nil {
			return 0, err
		}
		return len(recs), nil
	})
}

// checkpointer asks the database for a CHECKPOINT before each phase, so
// that a phase does not pay for the dirty pages of the one before it; a
// role that may not is told once and the bench goes on.
type checkpointer struct {
	st      *store.Store
	refused bool
}

func (c *checkpointer) run(ctx context.Context) {
	if c.st == nil || c.refused {
		return
	}
	if err := c.st.Checkpoint(ctx); err != nil {
		c.refused = true
		fmt.Fprintf(os.Stderr, "no CHECKPOINT between phases (%v); figures may vary more\n", err)
	}
}

var errExhausted = errors.New("no more encoded batches")

// waitRollups waits until no rollup of runs is marked stale, for at most
// limit, and says how long it waited. A server of role ingest refreshes no
// rollups, so when the markers stay as they are for stall the wait ends
// early: nothing is working on them.
func waitRollups(ctx context.Context, st *store.Store, runs []string, limit, stall time.Duration) error {
	start := time.Now()
	last, lastChange := int64(-1), start
	for {
		dirty, err := st.DirtyBlocks(ctx, runs)
		if err != nil {
			return fmt.Errorf("wait for rollups: %w", err)
		}
		waited := time.Since(start).Round(time.Second)
		switch {
		case dirty == 0:
			if waited > 0 {
				fmt.Fprintf(os.Stderr, "waited %s for the server to refresh the HTTP runs' rollups\n", waited)
			}
			return nil
		case waited >= limit:
			fmt.Fprintf(os.Stderr, "gave up waiting for rollups after %s (%d blocks still marked)\n", waited, dirty)
			return nil
		case dirty != last:
			last, lastChange = dirty, time.Now()
		case time.Since(lastChange) >= stall:
			fmt.Fprintf(os.Stderr, "%d rollup blocks unchanged for %s: the server refreshes none (role ingest?); going on\n", dirty, stall)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
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

// benchPerRank opens the database when given, runs the per-rank load and
// deletes its run unless keep is set.
func benchPerRank(ctx context.Context, c perRankBench, dbURL string, keep bool, flagErrs []error) error {
	if len(flagErrs) > 0 {
		return configError("bench ingest", flagErrs)
	}
	if c.duration < time.Second {
		return errors.New("bench ingest: --per-rank wants a --duration of at least 1s")
	}
	var st *store.Store
	if dbURL != "" {
		var err error
		if st, err = store.Open(ctx, dbURL, nil); err != nil {
			return fmt.Errorf("bench ingest: %w", err)
		}
		defer st.Close()
		if !keep {
			defer func() {
				cctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				if err := st.DeleteRuns(cctx, []string{c.runID}); err != nil {
					fmt.Fprintf(os.Stderr, "bench ingest: clean up: %v\n", err)
				}
			}()
		}
	}
	return runPerRank(ctx, c, st)
}

func randomTag() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// benchDir makes a bench's working directory, where its private
// PostgreSQL keeps its data. Made here, so opened here: run as root, that
// PostgreSQL runs as another user, which must enter it (serve itself
// never opens a directory it did not make).
func benchDir(prefix string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("open %s to the database's user: %w", dir, err)
	}
	return dir, nil
}
