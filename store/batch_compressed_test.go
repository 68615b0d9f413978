package store_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/fleettest"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// compressAll compresses every chunk of every hypertable, as the
// compression policy does once chunks are old enough.
func compressAll(t testing.TB, s *store.Store) {
	t.Helper()
	if _, err := storetest.Pool(t, s).Exec(context.Background(), `
		SELECT compress_chunk(c, if_not_compressed => true)
		FROM timescaledb_information.hypertables h,
		     LATERAL show_chunks(format('%I.%I', h.hypertable_schema, h.hypertable_name)::regclass) c
		WHERE h.hypertable_schema = current_schema()`); err != nil {
		t.Fatalf("compress chunks: %v", err)
	}
}

// uncompressedRows counts, per hypertable, the rows of run id that sit
// in the uncompressed part of a compressed chunk: rows a write had to
// decompress (or inserted) since compression.
func uncompressedRows(t testing.TB, s *store.Store, id string) map[string]int {
	t.Helper()
	ctx := context.Background()
	rows, err := storetest.Pool(t, s).Query(ctx, `SELECT hypertable_name, format('%I.%I', chunk_schema, chunk_name)
		FROM timescaledb_information.chunks WHERE is_compressed AND hypertable_name IN ('steps', 'layer_times', 'evals')`)
	if err != nil {
		t.Fatal(err)
	}
	type chunk struct{ table, name string }
	var chunks []chunk
	for rows.Next() {
		var c chunk
		if err := rows.Scan(&c.table, &c.name); err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, c := range chunks {
		out[c.table] += mustCount(t, s, `SELECT count(*) FROM ONLY `+c.name+` WHERE run_id = $1`, id)
	}
	return out
}

// runView is what the read paths answer about a run.
type runView struct {
	Evals   []store.EvalRow
	Loss    []store.RawPoint
	Layers  []store.LayerRow
	Timings []store.TimingRow
}

func viewOf(t testing.TB, s *store.Store, id string) runView {
	t.Helper()
	ctx := context.Background()
	var v runView
	var err error
	if v.Evals, err = s.Evals(ctx, id); err != nil {
		t.Fatal(err)
	}
	if v.Loss, err = s.SeriesRaw(ctx, id, 0, "loss", 0, 1<<40); err != nil {
		t.Fatal(err)
	}
	if v.Layers, err = s.LayersRaw(ctx, id, 1, 0, 1<<40, true); err != nil {
		t.Fatal(err)
	}
	if v.Timings, err = s.Timings(ctx, id, -1, 0, 1<<40); err != nil {
		t.Fatal(err)
	}
	for i := range v.Evals {
		v.Evals[i].Time = v.Evals[i].Time.UTC()
	}
	for i := range v.Loss {
		v.Loss[i].Time = v.Loss[i].Time.UTC()
	}
	for i := range v.Timings {
		v.Timings[i].Time = v.Timings[i].Time.UTC()
	}
	return v
}

// writeLines writes lines in batches of n records.
func writeLines(t testing.TB, s *store.Store, n int, lines []string) {
	t.Helper()
	for len(lines) > 0 {
		k := min(n, len(lines))
		if _, err := s.WriteBatch(context.Background(), mustDecodeTB(t, lines[:k]...)); err != nil {
			t.Fatalf("write batch: %v", err)
		}
		lines = lines[k:]
	}
}

// Retries, resumes, reads and retention on compressed chunks: a retried
// batch changes nothing and decompresses nothing, a resumed run replaces
// the steps it repeats and decompresses only the segments of the rank it
// writes, every read answers what it answered before compression, and
// retention removes a run whose rows are compressed.
func TestCompressedChunks(t *testing.T) {
	if !storetest.Mode(t).Timescale {
		t.Skip("needs TimescaleDB: this machine's PostgreSQL has no timescaledb extension (the suite runs on plain PostgreSQL)")
	}
	ctx := context.Background()
	s := storetest.NewStore(t)
	start := time.Now().Add(-30 * 24 * time.Hour).Truncate(24 * time.Hour)
	// 1,200 steps three minutes apart span two and a half days: three chunks.
	a := fleettest.GenRun{ID: "a", Ranks: 2, Steps: 1200, Start: start, Every: 3 * time.Minute, Seed: 1, Layers: 4, EvalEvery: 20}
	b := fleettest.GenRun{ID: "b", Ranks: 1, Steps: 1200, Start: start.Add(time.Minute), Every: 3 * time.Minute, Seed: 2, Layers: 4, EvalEvery: 20}
	for _, g := range []fleettest.GenRun{a, b} {
		for rank := range g.Ranks {
			writeLines(t, s, 2000, g.StepLines(rank, 0, g.Steps, 0))
		}
		writeLines(t, s, 2000, g.EvalLines())
	}
	before := viewOf(t, s, "a")
	compressAll(t, s)
	if n := mustCount(t, s, `SELECT count(*) FROM timescaledb_information.chunks WHERE hypertable_name = 'steps' AND is_compressed`); n < 3 {
		t.Fatalf("%d compressed steps chunks, want at least 3", n)
	}
	if got := viewOf(t, s, "a"); !reflect.DeepEqual(got, before) {
		t.Fatal("reads of compressed chunks differ from reads before compression")
	}

	// A retry: the same 1,000 records again.
	retry := a.StepLines(0, 300, 800, 0)
	res, err := s.WriteBatch(ctx, mustDecodeTB(t, retry...))
	if err != nil {
		t.Fatalf("retry on compressed chunks: %v", err)
	}
	wantResult(t, res, 0, len(retry))
	for _, id := range []string{"a", "b"} {
		for table, n := range uncompressedRows(t, s, id) {
			if n != 0 {
				t.Errorf("retry decompressed %d %s rows of run %s; a retry should decompress nothing", n, table, id)
			}
		}
	}

	// A resume from a checkpoint at step 1,100 of rank 0: the last 100
	// steps again, an hour later, with other values.
	resume := a.StepLines(0, 1100, 1200, time.Hour)
	res, err = s.WriteBatch(ctx, mustDecodeTB(t, resume...))
	if err != nil {
		t.Fatalf("resume on compressed chunks: %v", err)
	}
	wantResult(t, res, len(resume), 0)
	if n := mustCount(t, s, `SELECT count(*) FROM steps WHERE run_id = 'a' AND rank = 0`); n != a.Steps {
		t.Errorf("rank 0 has %d steps after the resume, want %d (each step once)", n, a.Steps)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM steps WHERE run_id = 'a' AND rank = 0 AND step >= 1100 AND time > $1`,
		start.Add(1100*3*time.Minute+30*time.Minute)); n != 100 {
		t.Errorf("%d resumed steps carry the resume's time, want 100", n)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM layer_times WHERE run_id = 'a' AND rank = 0`); n != a.Steps {
		t.Errorf("rank 0 has %d layers rows after the resume, want %d", n, a.Steps)
	}
	// Only rank 0's segments of run a could be decompressed, and of those
	// only the batches (1,000 rows at most each) that hold steps 1100+.
	for table, n := range uncompressedRows(t, s, "b") {
		if n != 0 {
			t.Errorf("resume of run a decompressed %d %s rows of run b", n, table)
		}
	}
	got := uncompressedRows(t, s, "a")
	for _, table := range []string{"steps", "layer_times"} {
		if got[table] < 100 || got[table] > 2*1000 {
			t.Errorf("resume left %d %s rows of run a uncompressed; want the touched batches only (100 to 2,000)", got[table], table)
		}
	}
	after := viewOf(t, s, "a")
	// Evaluations keep their figures; those from step 1100 on pair with
	// the resumed steps' training loss.
	for i := range after.Evals {
		a, b := after.Evals[i], before.Evals[i]
		if a.Step >= 1100 {
			a.TrainLoss, b.TrainLoss = nil, nil
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("evaluation at step %d changed by a resume that wrote no evaluations", a.Step)
		}
	}
	changed := 0
	for i := range after.Loss {
		if after.Loss[i] != before.Loss[i] {
			changed++
			if after.Loss[i].Step < 1100 {
				t.Fatalf("step %d changed; only steps from 1100 were resumed", after.Loss[i].Step)
			}
		}
	}
	if changed != 100 {
		t.Errorf("%d loss points changed, want the 100 resumed", changed)
	}

	// Retention removes the run from compressed chunks too.
	if _, err := storetest.Pool(t, s).Exec(ctx, `UPDATE runs SET updated_at = now() - interval '100 days' WHERE run_id = 'a'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ApplyRetention(ctx, 60*24*time.Hour); err != nil {
		t.Fatalf("retention: %v", err)
	}
	for table, n := range rowsOf(t, s, "a") {
		if n != 0 {
			t.Errorf("after retention run a keeps %d rows in %s", n, table)
		}
	}
	if n := mustCount(t, s, `SELECT count(*) FROM steps WHERE run_id = 'b'`); n != b.Steps {
		t.Errorf("run b has %d steps after run a's retention, want %d", n, b.Steps)
	}
}

// mustDecodeTB is mustDecode for benchmarks too.
func mustDecodeTB(t testing.TB, lines ...string) []api.Record {
	t.Helper()
	recs, err := api.DecodeBatch([]byte(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	return recs
}

// A database set up by an earlier version keeps a per-minute GPU
// aggregate that nothing reads and its refresh job; setup drops both.
func TestSetupTimescaleDropsTheGPUAggregate(t *testing.T) {
	if !storetest.Mode(t).Timescale {
		t.Skip("needs TimescaleDB: this machine's PostgreSQL has no timescaledb extension (the suite runs on plain PostgreSQL)")
	}
	ctx := context.Background()
	s := storetest.NewStore(t)
	for _, q := range []string{
		`CREATE MATERIALIZED VIEW gpu_samples_1m WITH (timescaledb.continuous) AS
			SELECT time_bucket('1 minute', time) AS bucket, host, gpu, avg(util_pct) AS util_pct_avg
			FROM gpu_samples GROUP BY bucket, host, gpu WITH NO DATA`,
		`SELECT add_continuous_aggregate_policy('gpu_samples_1m', start_offset => INTERVAL '1 day',
			end_offset => INTERVAL '1 minute', schedule_interval => INTERVAL '1 minute')`,
	} {
		if _, err := storetest.Pool(t, s).Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.SetupTimescale(ctx, store.TimescaleOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM timescaledb_information.continuous_aggregates`); n != 0 {
		t.Errorf("%d continuous aggregates after setup, want none", n)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM timescaledb_information.jobs WHERE proc_name = 'policy_refresh_continuous_aggregate'`); n != 0 {
		t.Errorf("%d refresh jobs after setup, want none", n)
	}
}

// Setting up again with the same configuration leaves the compression
// jobs as they are (replacing them at every start raced TimescaleDB's
// scheduler); another compress-after replaces them.
func TestSetupTimescaleKeepsUnchangedPolicies(t *testing.T) {
	if !storetest.Mode(t).Timescale {
		t.Skip("needs TimescaleDB: this machine's PostgreSQL has no timescaledb extension (the suite runs on plain PostgreSQL)")
	}
	ctx := context.Background()
	s := storetest.NewStore(t)
	jobs := func() map[string]string {
		t.Helper()
		rows, err := storetest.Pool(t, s).Query(ctx, `SELECT hypertable_name, job_id || ' ' || (config->>'compress_after')
			FROM timescaledb_information.jobs WHERE proc_name = 'policy_compression'`)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		var h, v string
		for rows.Next() {
			if err := rows.Scan(&h, &v); err != nil {
				t.Fatal(err)
			}
			out[h] = v
		}
		return out
	}
	if _, _, err := s.SetupTimescale(ctx, store.TimescaleOptions{}); err != nil {
		t.Fatal(err)
	}
	before := jobs()
	if len(before) != 6 {
		t.Fatalf("compression jobs: %v, want one per hypertable", before)
	}
	if _, _, err := s.SetupTimescale(ctx, store.TimescaleOptions{}); err != nil {
		t.Fatal(err)
	}
	if again := jobs(); !reflect.DeepEqual(again, before) {
		t.Errorf("setup with the same configuration replaced the jobs:\n%v\n%v", before, again)
	}
	if _, _, err := s.SetupTimescale(ctx, store.TimescaleOptions{CompressAfter: 48 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	for h, v := range jobs() {
		if !strings.HasSuffix(v, " 2 days") && !strings.HasSuffix(v, " 172800 seconds") && !strings.HasSuffix(v, "48:00:00") {
			t.Errorf("%s compression job after compress-after 48h: %s", h, v)
		}
	}
}

// A resume of several ranks in one batch on compressed chunks: ranks that
// resend the same steps share their statements, a rank with another range
// and a rank with only new steps get their own, and every rank ends with
// each step once, the resumed ones carrying the resume's values.
func TestCompressedResumeOfSeveralRanks(t *testing.T) {
	needTimescale(t)
	ctx := context.Background()
	s := storetest.NewStore(t)
	start := time.Now().Add(-30 * 24 * time.Hour).Truncate(24 * time.Hour)
	g := fleettest.GenRun{ID: "multi", Ranks: 4, Steps: 600, Start: start, Every: 3 * time.Minute, Seed: 3, Layers: 4}
	for rank := range g.Ranks {
		writeLines(t, s, 2000, g.StepLines(rank, 0, g.Steps, 0))
	}
	compressAll(t, s)
	if _, err := storetest.Pool(t, s).Exec(ctx, `DELETE FROM rollup_dirty`); err != nil {
		t.Fatal(err)
	}
	var resume []string
	resume = append(resume, g.StepLines(0, 500, 600, time.Hour)...)
	resume = append(resume, g.StepLines(1, 500, 600, time.Hour)...)
	resume = append(resume, g.StepLines(2, 550, 600, time.Hour)...)
	resume = append(resume, g.StepLines(3, 600, 650, time.Hour)...) // new steps only
	res, err := s.WriteBatch(ctx, mustDecodeTB(t, resume...))
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	wantResult(t, res, len(resume), 0)
	for rank, want := range map[int]struct{ steps, resumed int }{0: {600, 100}, 1: {600, 100}, 2: {600, 50}, 3: {650, 50}} {
		if n := mustCount(t, s, `SELECT count(*) FROM steps WHERE run_id = 'multi' AND rank = $1`, rank); n != want.steps {
			t.Errorf("rank %d has %d steps, want %d (each step once)", rank, n, want.steps)
		}
		if n := mustCount(t, s, `SELECT count(DISTINCT step) FROM layer_times WHERE run_id = 'multi' AND rank = $1`, rank); n != want.steps {
			t.Errorf("rank %d has layers for %d steps, want %d", rank, n, want.steps)
		}
		// The resume came an hour later: its steps are the ones stamped
		// after the run's own time for them.
		if n := mustCount(t, s, `SELECT count(*) FROM steps WHERE run_id = 'multi' AND rank = $1
			AND time > $2::timestamptz + step * interval '3 minutes' + interval '30 minutes'`, rank, start); n != want.resumed {
			t.Errorf("rank %d has %d steps with the resume's time, want %d", rank, n, want.resumed)
		}
		if n := mustCount(t, s, `SELECT count(*) FROM rollup_dirty WHERE run_id = 'multi' AND rank = $1`, rank); n == 0 {
			t.Errorf("rank %d: no rollup block marked dirty by the resume", rank)
		}
	}
}
