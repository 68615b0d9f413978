package query_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/fleettest"
	"github.com/deepseed/deepseed/query"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// TestCompressedCostReport compares, on one machine and interleaved, what
// retries, resumes and the read paths cost on compressed TimescaleDB
// chunks and on plain PostgreSQL tables holding the same run: 20,000
// steps of one rank with 27 layers and 1,000 evaluations. It is a report,
// not a check: run it with DEEPSEED_COMPRESSED_REPORT=1 on a machine with
// TimescaleDB.
func TestCompressedCostReport(t *testing.T) {
	if os.Getenv("DEEPSEED_COMPRESSED_REPORT") == "" {
		t.Skip("a report: set DEEPSEED_COMPRESSED_REPORT=1 to run it")
	}
	if !storetest.Mode(t).Timescale {
		t.Skip("needs TimescaleDB")
	}
	ctx := context.Background()
	rounds := 5
	start := time.Now().Add(-30 * 24 * time.Hour).Truncate(24 * time.Hour)
	g := fleettest.GenRun{ID: "bigrun", Ranks: 1, Steps: 20000, Start: start, Every: 15 * time.Second, Seed: 7, Layers: 24, EvalEvery: 20}
	other := fleettest.GenRun{ID: "other", Ranks: 2, Steps: 5000, Start: start, Every: 60 * time.Second, Seed: 8, Layers: 24, EvalEvery: 100}

	ts := storetest.NewStore(t)
	plainDB := "deepseed_plain_" + fmt.Sprint(time.Now().UnixNano()%1e9)
	admin := storetest.AdminURL(t)
	execAdmin(t, admin, `CREATE DATABASE `+plainDB)
	t.Cleanup(func() { execAdmin(t, admin, `DROP DATABASE IF EXISTS `+plainDB+` WITH (FORCE)`) })
	plain := storetest.Open(t, storetest.WithDatabase(admin, plainDB), nil)
	if _, err := plain.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	type target struct {
		name string
		s    *store.Store
		srv  *httptest.Server
	}
	var targets []*target
	for _, x := range []struct {
		name string
		s    *store.Store
	}{{"timescale", ts}, {"plain", plain}} {
		for _, r := range []fleettest.GenRun{g, other} {
			for rank := range r.Ranks {
				writeAll(t, x.s, r.StepLines(rank, 0, r.Steps, 0))
			}
			writeAll(t, x.s, r.EvalLines())
			if r.ID == g.ID {
				// A day of 1 Hz samples of the run's 8 GPUs.
				day := r
				day.Steps = int(24 * time.Hour / r.Every)
				writeAll(t, x.s, day.GPULines("node-1", 8))
			}
			if _, err := x.s.RefreshRollups(ctx, r.ID); err != nil {
				t.Fatal(err)
			}
		}
		e := echo.New()
		query.New(x.s, query.Options{Timeout: time.Minute}).Register(e.Group("/api/v1"))
		srv := httptest.NewServer(e)
		t.Cleanup(srv.Close)
		targets = append(targets, &target{x.name, x.s, srv})
	}
	if _, err := storetest.Pool(t, ts).Exec(ctx, `ANALYZE`); err != nil {
		t.Fatal(err)
	}
	if _, err := storetest.Pool(t, plain).Exec(ctx, `ANALYZE`); err != nil {
		t.Fatal(err)
	}
	compressTS(t, ts)

	retry := decodeAll(t, g.StepLines(0, 10000, 12500, 0)) // 5,000 records
	reads := []string{
		"/api/v1/runs/bigrun/evals",
		"/api/v1/runs/bigrun/series?metric=loss",
		"/api/v1/runs/bigrun/series?metric=step_ms&from=12000&to=12500",
		"/api/v1/runs/bigrun/heatmap",
		"/api/v1/runs/bigrun/heatmap?from=5000&to=5200&pass=backward",
		"/api/v1/runs/bigrun/ranks",
		"/api/v1/runs/bigrun/breakdown",
		"/api/v1/compare?run=bigrun&run=other",
		"/api/v1/gpus?host=node-1&from=" + start.Format(time.RFC3339) + "&to=" + start.Add(24*time.Hour).Format(time.RFC3339),
		"/api/v1/gpus?host=node-1&gpu=3&metric=power_w&from=" + start.Add(6*time.Hour).Format(time.RFC3339) + "&to=" + start.Add(7*time.Hour).Format(time.RFC3339),
	}
	times := map[string]map[string][]time.Duration{}
	add := func(target, what string, d time.Duration) {
		if times[what] == nil {
			times[what] = map[string][]time.Duration{}
		}
		times[what][target] = append(times[what][target], d)
	}
	for round := range rounds {
		for _, tg := range targets {
			t0 := time.Now()
			res, err := tg.s.WriteBatch(ctx, retry)
			if err != nil {
				t.Fatalf("%s retry: %v", tg.name, err)
			}
			if res.Accepted != 0 {
				t.Fatalf("%s retry accepted %d", tg.name, res.Accepted)
			}
			add(tg.name, "retry 5,000 records", time.Since(t0))

			resume := decodeAll(t, g.StepLines(0, 19900, 20000, time.Duration(round+1)*time.Hour))
			t0 = time.Now()
			if res, err := tg.s.WriteBatch(ctx, resume); err != nil || res.Accepted != 200 {
				t.Fatalf("%s resume: %+v %v", tg.name, res, err)
			}
			add(tg.name, "resume 100 steps", time.Since(t0))
			for _, path := range reads {
				t0 = time.Now()
				getOK(t, tg.srv.URL+path)
				add(tg.name, path, time.Since(t0))
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-72s %12s %12s %7s\n", "median of "+fmt.Sprint(rounds)+" interleaved rounds", "timescale", "plain", "ratio")
	order := append([]string{"retry 5,000 records", "resume 100 steps"}, reads...)
	for _, what := range order {
		m1, m2 := median(times[what]["timescale"]), median(times[what]["plain"])
		fmt.Fprintf(&b, "%-72s %12v %12v %7.2f\n", trimURL(what), m1.Round(100*time.Microsecond), m2.Round(100*time.Microsecond), float64(m1)/float64(m2))
	}
	rows, err := storetest.Pool(t, ts).Query(ctx, `SELECT hypertable_name, format('%I.%I', chunk_schema, chunk_name), is_compressed
		FROM timescaledb_information.chunks WHERE hypertable_name IN ('steps', 'layer_times', 'evals') ORDER BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	type chunk struct {
		table, name string
		compressed  bool
	}
	var chunks []chunk
	for rows.Next() {
		var c chunk
		if err := rows.Scan(&c.table, &c.name, &c.compressed); err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, c)
	}
	rows.Close()
	loose := map[string]int{}
	for _, c := range chunks {
		var n int
		if err := storetest.Pool(t, ts).QueryRow(ctx, `SELECT count(*) FROM ONLY `+c.name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		loose[c.table] += n
		if !c.compressed {
			t.Errorf("%s is not compressed", c.name)
		}
	}
	fmt.Fprintf(&b, "rows in the uncompressed part of compressed chunks after the rounds: %v\n", loose)
	explainRetry(t, ts, &b)
	t.Log(b.String())
}

// explainRetry shows how many compressed batches the old merge (a join
// against the temporary table) and the segment statements read and
// decompress for a retry of steps 10,000 to 12,499.
func explainRetry(t *testing.T, s *store.Store, b *strings.Builder) {
	ctx := context.Background()
	tx, err := storetest.Pool(t, s).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, q := range []string{
		`CREATE TEMP TABLE tmp_report_steps ON COMMIT DROP AS SELECT * FROM steps WHERE run_id = 'bigrun' AND step BETWEEN 10000 AND 12499`,
		`SET LOCAL plan_cache_mode = force_custom_plan`,
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ name, sql string }{
		{"join (old merge's NOT EXISTS)", `SELECT count(*) FROM tmp_report_steps src WHERE NOT EXISTS (SELECT 1 FROM steps t
			WHERE t.run_id = src.run_id AND t.rank = src.rank AND t.step = src.step AND t.time >= src.time)`},
		{"segment probe", `SELECT count(*) FROM steps AS t JOIN tmp_report_steps AS s ON s.run_id = 'bigrun' AND s.rank = 0 AND s.step = t.step AND t.time < s.time
			WHERE t.run_id = 'bigrun' AND t.rank = 0 AND t.step BETWEEN 10000 AND 12499`},
		{"segment insert's NOT EXISTS", `SELECT count(*) FROM tmp_report_steps src WHERE NOT EXISTS (SELECT 1 FROM steps AS t
			WHERE t.run_id = 'bigrun' AND t.rank = 0 AND t.step BETWEEN 10000 AND 12499 AND t.step = src.step AND t.time >= src.time)`},
	} {
		rows, err := tx.Query(ctx, `EXPLAIN (ANALYZE, TIMING OFF) `+c.sql)
		if err != nil {
			t.Fatal(err)
		}
		batches, tuples := 0, 0
		var line string
		var plan strings.Builder
		for rows.Next() {
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan.WriteString(line + "\n")
			// A scan of a compressed chunk's batches reads one row per
			// batch; its DecompressChunk node above yields their rows.
			_, after, ok := strings.Cut(line, "actual rows=")
			if !ok {
				continue
			}
			var n int
			fmt.Sscan(after, &n)
			if strings.Contains(line, " on compress_hyper_") {
				batches += n
			} else if strings.Contains(line, "DecompressChunk") {
				tuples += n
			}
		}
		rows.Close()
		if os.Getenv("DEEPSEED_REPORT_PLANS") != "" {
			fmt.Fprintln(b, plan.String())
		}
		fmt.Fprintf(b, "EXPLAIN ANALYZE %-32s compressed batches read %5d, rows decompressed %8d\n", c.name+":", batches, tuples)
	}
}

func execAdmin(t *testing.T, u, sql string) {
	t.Helper()
	if _, err := storetest.Pool(t, u).Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func decodeAll(t *testing.T, lines []string) []api.Record {
	t.Helper()
	recs, err := api.DecodeBatch([]byte(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func writeAll(t *testing.T, s *store.Store, lines []string) {
	t.Helper()
	for len(lines) > 0 {
		k := min(4000, len(lines))
		if _, err := s.WriteBatch(context.Background(), decodeAll(t, lines[:k])); err != nil {
			t.Fatal(err)
		}
		lines = lines[k:]
	}
}

func compressTS(t *testing.T, s *store.Store) {
	t.Helper()
	if _, err := storetest.Pool(t, s).Exec(context.Background(), `
		SELECT compress_chunk(c, if_not_compressed => true)
		FROM timescaledb_information.hypertables h,
		     LATERAL show_chunks(format('%I.%I', h.hypertable_schema, h.hypertable_name)::regclass) c
		WHERE h.hypertable_schema = current_schema()`); err != nil {
		t.Fatalf("compress chunks: %v", err)
	}
}

func getOK(t *testing.T, u string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", u, resp.StatusCode, body)
	}
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// trimURL shortens the times in a report line.
func trimURL(s string) string {
	if i := strings.Index(s, "&from="); i > 0 {
		return s[:i] + "&from…&to…"
	}
	return s
}
