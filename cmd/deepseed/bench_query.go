package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/internal/fleettest"
	"github.com/deepseed/deepseed/query"
)

const benchQueryNotes = `
The tool first writes the runs through the server's own ingest API
(POST /api/v1/ingest, gzip NDJSON, --connections at a time): one run of
--ranks ranks and --steps steps, a layers record of --layers layers every
--layer-every steps, an evaluation every 500 steps, one GPU sample a
second for every rank's GPU (--gpus-per-node to a node), one rank planted
30 ms late at the all-reduce; and --compare-runs more runs of the same
shape and --compare-steps steps, for the comparison of runs; and
--list-runs more runs of that shape for the runs list, every third left
running with the steps it will take known (its summary estimates its
finish), the others finished, every other one a trial of one sweep. Runs that
already hold steps are not written again (--prefix names them), so a
second call times the same data.

Then every query the provisioned dashboards make for a run is sent
--rounds times, the queries interleaved within each round, and each one's
median, p95, largest time and answer size are printed; with --list-runs,
also a page of 100 runs of the runs list, the runs of the sweep and their
comparison (GET /compare?sweep=).
--warmup rounds come first and are not counted.

With --database-url (the server's database), each table's bytes (indexes
and TOAST included; a hypertable's chunks, compressed or not) are printed
last, per rank-step of the runs the tool wrote, raw tables apart from the
state derived from them, with PostgreSQL's count of dead row versions.`

// benchReadToken is the read token bench query may send for its queries;
// without it they go with the ingest token.
var benchReadToken = tokenKind{"read token (default: the ingest token)", "DEEPSEED_READ_TOKEN", "DEEPSEED_READ_TOKEN_FILE", "DEEPSEED_READ_TOKENS"}

// BenchQuery is "deepseed bench query".
func benchQuery(ctx context.Context, args []string) error {
	f := newEnvFlags("bench query")
	server := f.String("server", "DEEPSEED_SERVER_URL", "http://localhost:8080", "DeepSeed server base URL (ingest and query)")
	queryServer := f.String("query-server", "", "", "query from this server instead (a query replica); defaults to --server")
	tok := addTokenFlag(f, ingestToken)
	readTok := addNamedTokenFlag(f, "read-token", benchReadToken)
	prefix := f.String("prefix", "", "fleet", "run ids are PREFIX-RANKSxSTEPS and PREFIX-RANKSxSTEPS-cN")
	ranks := f.String("ranks", "", "128", "ranks of the run")
	steps := f.String("steps", "", "3000", "steps of the run")
	layers := f.String("layers", "", "26", "layers of the model")
	layerEvery := f.String("layer-every", "", "10", "steps between layers records (the hook's default)")
	gpusPerNode := f.String("gpus-per-node", "", "8", "GPUs (ranks) a node")
	compareRuns := f.String("compare-runs", "", "4", "more runs to compare the run with")
	compareSteps := f.String("compare-steps", "", "300", "steps of each of those runs")
	listRuns := f.String("list-runs", "", "0", "more runs of the compared runs' shape, for the runs list (GET /runs?limit=100)")
	conns := f.String("connections", "", "4", "concurrent ingest requests while loading")
	rounds := f.String("rounds", "", "9", "timed rounds")
	warmup := f.String("warmup", "", "1", "rounds before the timed ones")
	only := f.String("only", "", "", "time only the queries whose names contain this")
	dbURL := f.String("database-url", "DEEPSEED_DATABASE_URL", "", "database of that server: also print each table's bytes per rank-step after the rounds")
	f.setUsage("deepseed bench query [flags]", "Load a run of many ranks through ingest and time every dashboard query of it.", benchQueryNotes)
	if err := f.parse(args); err != nil {
		return err
	}
	var errs []error
	num := func(name, v string, min int) int { return wholeAtLeast(&errs, name, v, min) }
	run := fleettest.Bench{Ranks: num("ranks", *ranks, 1), Steps: num("steps", *steps, 1), Layers: num("layers", *layers, 1),
		LayerEvery: num("layer-every", *layerEvery, 0), EvalEvery: 500, GPUsPerNode: num("gpus-per-node", *gpusPerNode, 1),
		Start: time.Now().UTC().Add(-24 * time.Hour).Truncate(time.Second)}
	nCompare, nCompareSteps := num("compare-runs", *compareRuns, 0), num("compare-steps", *compareSteps, 1)
	nList := num("list-runs", *listRuns, 0)
	nConns, nRounds, nWarm := num("connections", *conns, 1), num("rounds", *rounds, 1), num("warmup", *warmup, 0)
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	base, err := serverURL(*server)
	if err != nil {
		return err
	}
	qbase := base
	if *queryServer != "" {
		if qbase, err = serverURL(*queryServer); err != nil {
			return fmt.Errorf("--query-server: %w", err)
		}
	}
	token, err := tok.value()
	if err != nil {
		return fmt.Errorf("bench query: %w", err)
	}
	readToken, err := readTok.value()
	if err != nil {
		return fmt.Errorf("bench query: %w", err)
	}
	if readToken == "" {
		readToken = token
	}
	run.ID = fmt.Sprintf("%s-%dx%d", *prefix, run.Ranks, run.Steps)
	run.Late = run.Ranks / 3
	runs := []fleettest.Bench{run}
	for i := 1; i <= nCompare; i++ {
		c := run
		c.ID, c.Steps, c.Late = fmt.Sprintf("%s-c%d", run.ID, i), nCompareSteps, -1
		runs = append(runs, c)
	}
	sweep := ""
	if nList > 0 {
		sweep = run.ID + "-sweep"
	}
	for i := 1; i <= nList; i++ {
		l := run
		l.ID, l.Steps, l.Late = fmt.Sprintf("%s-l%d", run.ID, i), nCompareSteps, -1
		if i%2 == 0 {
			l.SweepID = sweep
		}
		if i%3 == 0 {
			l.TotalSteps = 2 * nCompareSteps
		}
		runs = append(runs, l)
	}
	ingestURL := base.String() + "/api/v1/ingest"
	for i, r := range runs {
		if err := loadFleetRun(ctx, qbase.String(), ingestURL, token, readToken, r, nConns, i > 0 && r.TotalSteps == 0); err != nil {
			return err
		}
	}
	ids := make([]string, 1+nCompare)
	for i, r := range runs[:len(ids)] {
		ids[i] = r.ID
	}
	cases := benchQueries(run, ids, sweep)
	if err := firstAnswers(ctx, qbase.String()+"/api/v1", readToken, cases, *only); err != nil {
		return err
	}
	drain := time.Now()
	for _, r := range runs {
		if err := waitRolledUp(ctx, qbase.String(), readToken, r); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "every run rolled up %s after the load\n", time.Since(drain).Round(time.Second))
	if err := timeQueries(ctx, qbase.String()+"/api/v1", readToken, cases, nRounds, nWarm, *only); err != nil {
		return err
	}
	if *dbURL == "" {
		return nil
	}
	var rankSteps int64
	for _, r := range runs {
		rankSteps += int64(r.Ranks) * int64(r.Steps)
	}
	return printTableSizes(ctx, os.Stdout, *dbURL, rankSteps)
}

// loadFleetRun writes r unless the server already has its steps.
func loadFleetRun(ctx context.Context, queryBase, ingestURL, token, readToken string, r fleettest.Bench, conns int, end bool) error {
	body, _, err := benchGet(ctx, queryBase+"/api/v1/runs/"+url.PathEscape(r.ID), readToken)
	if err == nil && strings.Contains(string(body), `"steps":`) && !strings.Contains(string(body), `"steps":0,`) {
		fmt.Fprintf(os.Stderr, "%s: already loaded\n", r.ID)
		return nil
	}
	post := func(recs []api.Record) (int, error) {
		gz, err := ingest.EncodeNDJSON(recs, true)
		if err != nil {
			return 0, err
		}
		res, err := postWithRetry(ctx, ingestURL, token, gz)
		if err != nil {
			return 0, fmt.Errorf("load %s: %w", r.ID, err)
		}
		if res.Accepted+res.Duplicates != len(recs) {
			return 0, fmt.Errorf("load %s: server took %d + %d duplicates of %d records", r.ID, res.Accepted, res.Duplicates, len(recs))
		}
		return len(recs), nil
	}
	if _, err := post([]api.Record{r.RunRecord()}); err != nil {
		return err
	}
	// A batch is about 5,000 step records, as a busy collector sends.
	per := int64(max(1, 5000/r.Ranks))
	var next, sent atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	errc := make(chan error, conns)
	for c := 0; c < conns; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				from := next.Add(per) - per
				if from >= int64(r.Steps) || ctx.Err() != nil {
					return
				}
				recs := append(r.StepRecords(from, per), r.GPURecords(from, per)...)
				n, err := post(recs)
				if err != nil {
					errc <- err
					return
				}
				if total := sent.Add(int64(n)); from/per%50 == 0 {
					fmt.Fprintf(os.Stderr, "%s: step %d of %d, %d records, %.0f records/s\n", r.ID, from, r.Steps, total,
						float64(total)/time.Since(start).Seconds())
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return err
	}
	if end {
		if _, err := post([]api.Record{r.EndRecord()}); err != nil {
			return err
		}
	}
	took := time.Since(start)
	fmt.Fprintf(os.Stderr, "%s: %d records in %s (%.0f records/s, %.1f steps/s of %d ranks)\n", r.ID, sent.Load(), took.Round(time.Second),
		float64(sent.Load())/took.Seconds(), float64(r.Steps)/took.Seconds(), r.Ranks)
	return nil
}

// benchQueryCase is one dashboard query.
type benchQueryCase struct{ name, path string }

// benchQueries are the queries the provisioned dashboards make for run r
// (ids: r first, then the runs it is compared with), and with a sweep of
// the list runs a page of 100 runs, the runs of that sweep and their
// comparison.
func benchQueries(r fleettest.Bench, ids []string, sweep string) []benchQueryCase {
	id := url.PathEscape(r.ID)
	q := url.QueryEscape(r.ID)
	cmp := make([]string, len(ids))
	for i, s := range ids {
		cmp[i] = "run=" + url.QueryEscape(s)
	}
	cases := []benchQueryCase{
		{"summary", "/runs/" + id},
		{"runs list", "/runs?limit=50"},
		{"series loss", "/runs/" + id + "/series?metric=loss&max_points=1000"},
		{"series step_ms all ranks", "/runs/" + id + "/series?metric=step_ms&rank=all&max_points=1000"},
		{"series lateness all ranks", "/runs/" + id + "/series?metric=lateness_ms&rank=all&max_points=1000"},
		{"ranks", "/runs/" + id + "/ranks"},
		{"breakdown", "/runs/" + id + "/breakdown"},
		{"heatmap", "/runs/" + id + "/heatmap?max_steps=500"},
		{"evals", "/runs/" + id + "/evals"},
		{"memory", "/runs/" + id + "/memory"},
		{"compare 5 runs", "/compare?" + strings.Join(cmp, "&")},
		{"gpus of a node", "/gpus?run_id=" + q + "&host=" + url.QueryEscape(r.Host(0)) + "&max_points=1000"},
		{"annotations", "/annotations?run_id=" + q},
		{"alerts", "/alerts?run_id=" + q},
	}
	if sweep != "" {
		cases = append(cases, benchQueryCase{"runs list of 100", "/runs?limit=100"},
			benchQueryCase{"runs of a sweep", "/runs?limit=100&sweep=" + url.QueryEscape(sweep)},
			benchQueryCase{"compare of a sweep", "/compare?sweep=" + url.QueryEscape(sweep)})
	}
	return cases
}

// timeQueries sends every case rounds times, interleaved, and prints
// each one's median, p95 and largest time and its answer's size.
func timeQueries(ctx context.Context, base, token string, cases []benchQueryCase, rounds, warmup int, only string) error {
	var sel []benchQueryCase
	for _, c := range cases {
		if only == "" || strings.Contains(c.name, only) {
			sel = append(sel, c)
		}
	}
	durs := make([][]time.Duration, len(sel))
	size := make([]int, len(sel))
	for round := 0; round < warmup+rounds; round++ {
		for i, c := range sel {
			start := time.Now()
			body, code, err := benchGet(ctx, base+c.path, token)
			d := time.Since(start)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			if code != http.StatusOK {
				return fmt.Errorf("%s: status %d: %.300s", c.name, code, body)
			}
			if round >= warmup {
				durs[i] = append(durs[i], d)
				size[i] = len(body)
			}
		}
	}
	fmt.Printf("%-28s %10s %10s %10s %12s\n", "query", "p50 ms", "p95 ms", "max ms", "bytes")
	for i, c := range sel {
		d := durs[i]
		sort.Slice(d, func(a, b int) bool { return d[a] < d[b] })
		ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
		fmt.Printf("%-28s %10.1f %10.1f %10.1f %12d\n", c.name, ms(quantile(d, 0.5)), ms(quantile(d, 0.95)), ms(d[len(d)-1]), size[i])
	}
	return nil
}

// firstAnswers sends every case once, right after the load and before
// the rollups caught up with it, and prints each one's status, time,
// size and the rollup lag it reported: every view must answer at once
// whatever the refresh backlog. A status other than 200 is printed, not
// an error, so that every query's is seen.
func firstAnswers(ctx context.Context, base, token string, cases []benchQueryCase, only string) error {
	fmt.Printf("right after the load:\n%-28s %6s %10s %12s %10s %12s\n", "query", "status", "ms", "bytes", "lag s", "lag blocks")
	for _, c := range cases {
		if only != "" && !strings.Contains(c.name, only) {
			continue
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+c.path, nil)
		if err != nil {
			return err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		start := time.Now()
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		n, err := io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		d := time.Since(start)
		lag, blocks := res.Header.Get(query.RollupLagHeader), res.Header.Get(query.RollupLagBlocksHeader)
		fmt.Printf("%-28s %6d %10.1f %12d %10s %12s\n", c.name, res.StatusCode, float64(d.Microseconds())/1000, n, cmp.Or(lag, "-"), cmp.Or(blocks, "-"))
	}
	return nil
}

func benchGet(ctx context.Context, u, token string) ([]byte, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, 0, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	return body, res.StatusCode, err
}

// waitRolledUp waits, at most ten minutes, until the server's summary of r
// counts every step of its lowest rank: its rollups have caught up with
// the load, so the timed queries do not pay for the refresh.
func waitRolledUp(ctx context.Context, queryBase, token string, r fleettest.Bench) error {
	start := time.Now()
	for {
		body, code, err := benchGet(ctx, queryBase+"/api/v1/runs/"+url.PathEscape(r.ID), token)
		if err != nil {
			return fmt.Errorf("summary of %s: %w", r.ID, err)
		}
		var sum struct {
			Steps int64 `json:"steps"`
		}
		if code == http.StatusOK && json.Unmarshal(body, &sum) == nil && sum.Steps >= int64(r.Steps) {
			if waited := time.Since(start); waited > time.Second {
				fmt.Fprintf(os.Stderr, "%s: rollups caught up after %s\n", r.ID, waited.Round(time.Second))
			}
			return nil
		}
		if time.Since(start) > 10*time.Minute {
			fmt.Fprintf(os.Stderr, "%s: rollups still behind after 10 minutes (%d of %d steps); timing anyway\n", r.ID, sum.Steps, r.Steps)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}
