package store_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// runRecords writes steps, layers, an eval, an event, a memory record, an
// attributed GPU sample and an end for run id, its data stamped at t.
func runRecords(id string, t time.Time) []string {
	at := func(d time.Duration) string { return t.Add(d).UTC().Format(time.RFC3339Nano) }
	var lines []string
	for step := range 250 {
		lines = append(lines,
			fmt.Sprintf(`{"kind":"step","run_id":%q,"rank":0,"step":%d,"time":%q,"loss":%g,"step_ms":100}`, id, step, at(time.Duration(step)*time.Second), 3-float64(step)/100),
			fmt.Sprintf(`{"kind":"layers","run_id":%q,"rank":0,"step":%d,"time":%q,"names":["a","b"],"forward_ms":[1,2],"backward_ms":[2,4]}`, id, step, at(time.Duration(step)*time.Second)))
	}
	return append(lines,
		fmt.Sprintf(`{"kind":"eval","run_id":%q,"step":100,"time":%q,"loss":2.1}`, id, at(100*time.Second)),
		fmt.Sprintf(`{"kind":"event","run_id":%q,"time":%q,"type":"checkpoint","text":"saved"}`, id, at(200*time.Second)),
		fmt.Sprintf(`{"kind":"memory","run_id":%q,"time":%q,"parameters_bytes":1e9}`, id, at(0)),
		fmt.Sprintf(`{"kind":"gpu","time":%q,"host":"node-%s","gpu":0,"util_pct":97,"run_id":%q}`, at(10*time.Second), id, id),
		fmt.Sprintf(`{"kind":"end","run_id":%q,"time":%q,"status":"finished","summary":{"acc":0.9}}`, id, at(300*time.Second)))
}

// rowsOf counts the rows of run id in every table that holds run rows.
func rowsOf(t *testing.T, s *store.Store, id string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, tbl := range []string{"runs", "steps", "layer_times", "evals", "events", "memory_breakdowns",
		"gpu_samples", "gpu_minutes", "rank_hosts", "rollup_dirty", "metric_rollups", "metric_spread", "layer_rollups", "rank_score_heads", "rank_score_spans", "run_summaries"} {
		out[tbl] = mustCount(t, s, "SELECT count(*) FROM "+tbl+" WHERE run_id = $1", id)
	}
	return out
}

// The retention rule: a run idle past the horizon is dropped whole, its
// rollups included; a recent run and a run imported today with old
// timestamps stay whole; GPU samples of no run and host samples go by
// their own time.
func TestApplyRetention(t *testing.T) {
	ctx := context.Background()
	s := storetest.NewStore(t)
	now := time.Now()
	longAgo := now.Add(-200 * 24 * time.Hour)
	mustWrite(t, s, runRecords("old", longAgo)...)
	mustWrite(t, s, runRecords("recent", now.Add(-time.Hour))...)
	mustWrite(t, s, runRecords("imported", longAgo)...)
	for _, id := range []string{"old", "recent", "imported"} {
		if _, err := s.RefreshRollups(ctx, id); err != nil {
			t.Fatal(err)
		}
		// Straggler scores the evaluator stored: two spans and a head.
		if err := s.AddRankScores(ctx, id, []store.RankScore{{Rank: 0, Step: 1, Time: longAgo, Score: 0.1},
			{Rank: 0, Step: 2, Time: longAgo, Score: 0.5}}); err != nil {
			t.Fatal(err)
		}
	}
	// "old" was last written to 100 days ago ("imported" just now).
	if _, err := storetest.Pool(t, s).Exec(ctx, `UPDATE runs SET updated_at = now() - interval '100 days' WHERE run_id = 'old'`); err != nil {
		t.Fatal(err)
	}
	stamp := func(tm time.Time) string { return tm.UTC().Format(time.RFC3339Nano) }
	mustWrite(t, s,
		fmt.Sprintf(`{"kind":"gpu","time":%q,"host":"idle","gpu":0,"util_pct":1}`, stamp(longAgo)),
		fmt.Sprintf(`{"kind":"gpu","time":%q,"host":"idle","gpu":0,"util_pct":2}`, stamp(now.Add(-time.Hour))),
		fmt.Sprintf(`{"kind":"gpu","time":%q,"host":"gone","gpu":0,"util_pct":3,"run_id":"never-announced"}`, stamp(longAgo)),
		fmt.Sprintf(`{"kind":"host","time":%q,"host":"idle","cpu_util_pct":5}`, stamp(longAgo)),
		fmt.Sprintf(`{"kind":"host","time":%q,"host":"idle","cpu_util_pct":6}`, stamp(now.Add(-time.Hour))))
	// A GPU sample naming a run that has no runs row belongs to no run.
	if _, err := storetest.Pool(t, s).Exec(ctx, `DELETE FROM runs WHERE run_id = 'never-announced'`); err != nil {
		t.Fatal(err)
	}

	if s.Timescale {
		// As in production, where chunks older than --compress-after are
		// compressed: retention deletes from compressed chunks too.
		for _, h := range []string{"steps", "layer_times", "evals", "events", "gpu_samples", "host_samples"} {
			if _, err := storetest.Pool(t, s).Exec(ctx, `SELECT compress_chunk(c) FROM show_chunks($1::regclass, older_than => interval '7 days') c`, h); err != nil {
				t.Fatalf("compress %s: %v", h, err)
			}
		}
		if n := mustCount(t, s, `SELECT count(*) FROM timescaledb_information.chunks WHERE is_compressed`); n == 0 {
			t.Fatal("setup: no chunk compressed")
		}
	}
	before := map[string]map[string]int{}
	for _, id := range []string{"old", "recent", "imported"} {
		before[id] = rowsOf(t, s, id)
		if before[id]["metric_rollups"] == 0 || before[id]["layer_rollups"] == 0 || before[id]["gpu_samples"] != 1 ||
			before[id]["rank_score_spans"] != 2 || before[id]["rank_score_heads"] != 1 {
			t.Fatalf("setup: run %s rows %v; want rollups, a GPU sample and scores", id, before[id])
		}
	}

	res, err := s.ApplyRetention(ctx, 90*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if res.Runs != 1 {
		t.Errorf("ApplyRetention dropped %d runs, want 1", res.Runs)
	}
	for tbl, n := range rowsOf(t, s, "old") {
		if n != 0 {
			t.Errorf("run old still has %d rows in %s", n, tbl)
		}
	}
	for _, id := range []string{"recent", "imported"} {
		after := rowsOf(t, s, id)
		for tbl, n := range before[id] {
			if after[tbl] != n {
				t.Errorf("run %s: %s rows %d -> %d, want untouched", id, tbl, n, after[tbl])
			}
		}
	}
	if n := mustCount(t, s, `SELECT count(*) FROM gpu_samples WHERE host IN ('idle', 'gone')`); n != 1 {
		t.Errorf("%d GPU samples of no run left, want 1 (the recent one)", n)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM host_samples WHERE time < now() - interval '90 days'`); n != 0 {
		t.Errorf("%d old host samples left, want 0", n)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM host_minutes WHERE minute < now() - interval '90 days'`); n != 0 {
		t.Errorf("%d minutes of old host samples left, want 0", n)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM host_minutes`); n != 1 {
		t.Errorf("%d minutes of host samples left, want the recent sample's", n)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM host_samples`); n != 1 {
		t.Errorf("%d host samples left, want 1 (the recent one)", n)
	}

	// Nothing more to drop; 0 keeps everything.
	if res, err := s.ApplyRetention(ctx, 90*24*time.Hour); err != nil || res.Runs != 0 {
		t.Fatalf("second pass = %+v, %v; want nothing dropped", res, err)
	}
	if res, err := s.ApplyRetention(ctx, 0); err != nil || res.Runs != 0 {
		t.Fatalf("retention 0 = %+v, %v; want nothing dropped", res, err)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM runs`); n != 2 {
		t.Fatalf("%d runs left, want 2", n)
	}
}

// A run written to again after a long pause counts from that write: it
// is kept whole, its old rows included.
func TestApplyRetentionKeepsRevivedRun(t *testing.T) {
	ctx := context.Background()
	s := storetest.NewStore(t)
	longAgo := time.Now().Add(-200 * 24 * time.Hour)
	mustWrite(t, s, runRecords("revived", longAgo)...)
	if _, err := storetest.Pool(t, s).Exec(ctx, `UPDATE runs SET updated_at = now() - interval '100 days'`); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, s, fmt.Sprintf(`{"kind":"step","run_id":"revived","rank":0,"step":1000,"time":%q,"loss":1}`,
		time.Now().UTC().Format(time.RFC3339Nano)))
	if _, err := s.ApplyRetention(ctx, 90*24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM steps WHERE run_id = 'revived'`); n != 251 {
		t.Fatalf("revived run has %d steps, want 251", n)
	}
}

// A batch for an expired run that commits while the job waits for the
// run's lock wins: the job rechecks the run's last write under the lock
// and keeps it whole.
func TestApplyRetentionYieldsToConcurrentWrite(t *testing.T) {
	ctx := context.Background()
	s := storetest.NewStore(t)
	mustWrite(t, s, runRecords("busy", time.Now().Add(-200*24*time.Hour))...)
	if _, err := storetest.Pool(t, s).Exec(ctx, `UPDATE runs SET updated_at = now() - interval '100 days'`); err != nil {
		t.Fatal(err)
	}
	// Stand in for a batch in flight: the run's lock that ingest holds
	// shared, the write of runs.updated_at, not committed yet.
	tx, err := storetest.Pool(t, s).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared($1)`, store.RunLockKey("busy")); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE runs SET updated_at = now() WHERE run_id = 'busy'`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		res store.RetentionResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := s.ApplyRetention(ctx, 90*24*time.Hour)
		done <- result{res, err}
	}()
	// Commit once the job waits for the run's lock.
	deadline := time.Now().Add(2 * time.Minute)
	for mustCount(t, s, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the retention job never waited for the run's lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.res.Runs != 0 {
		t.Fatalf("ApplyRetention = %+v, %v; want the busy run kept", r.res, r.err)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM steps WHERE run_id = 'busy'`); n != 250 {
		t.Fatalf("busy run has %d steps after the job, want 250", n)
	}
}

// holdRun makes every delete of run id's runs row fail, as a real fault
// would (a trigger raising an error), until the returned func is called.
func holdRun(t *testing.T, s *store.Store, id string) (release func()) {
	t.Helper()
	ctx := context.Background()
	if _, err := storetest.Pool(t, s).Exec(ctx, `CREATE FUNCTION test_hold_run() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'run % is held by the test', OLD.run_id; END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := storetest.Pool(t, s).Exec(ctx, `CREATE TRIGGER test_hold_run BEFORE DELETE ON runs FOR EACH ROW
		WHEN (OLD.run_id = '`+id+`') EXECUTE FUNCTION test_hold_run()`); err != nil {
		t.Fatal(err)
	}
	return func() {
		if _, err := storetest.Pool(t, s).Exec(ctx, `DROP TRIGGER test_hold_run ON runs`); err != nil {
			t.Fatal(err)
		}
	}
}

// A run that cannot be dropped does not hold the others back: the run
// after it is dropped in the same pass, the failure is counted and logged
// with the failing run's id, the failing run stays whole, and the next
// pass, once the fault is gone, drops it.
func TestApplyRetentionGoesPastAFailingRun(t *testing.T) {
	ctx := context.Background()
	var logged bytes.Buffer
	s := storetest.Open(t, storetest.NewDatabase(t), slog.New(slog.NewTextHandler(&logged, nil)))
	s.Timescale = storetest.Mode(t).Timescale
	longAgo := time.Now().Add(-200 * 24 * time.Hour)
	// "a-held" sorts first: the pass meets it before "b-small".
	mustWrite(t, s, runRecords("a-held", longAgo)...)
	mustWrite(t, s, runRecords("b-small", longAgo)...)
	if _, err := storetest.Pool(t, s).Exec(ctx, `UPDATE runs SET updated_at = now() - interval '100 days'`); err != nil {
		t.Fatal(err)
	}
	before := rowsOf(t, s, "a-held")
	release := holdRun(t, s, "a-held")

	res, err := s.ApplyRetention(ctx, 90*24*time.Hour)
	if err != nil {
		t.Fatalf("ApplyRetention: %v; want the pass to go on past the failing run", err)
	}
	if res.Runs != 1 || res.Failures != 1 {
		t.Errorf("ApplyRetention = %+v; want 1 run dropped and 1 failure", res)
	}
	for tbl, n := range rowsOf(t, s, "b-small") {
		if n != 0 {
			t.Errorf("run b-small still has %d rows in %s", n, tbl)
		}
	}
	if after := rowsOf(t, s, "a-held"); !reflect.DeepEqual(after, before) {
		t.Errorf("run a-held rows %v -> %v; want it whole", before, after)
	}
	if out := logged.String(); !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "run_id=a-held") ||
		!strings.Contains(out, "held by the test") {
		t.Errorf("log does not name the failing run and its error:\n%s", out)
	}

	release()
	res, err = s.ApplyRetention(ctx, 90*24*time.Hour)
	if err != nil || res.Runs != 1 || res.Failures != 0 {
		t.Fatalf("pass after the fault = %+v, %v; want a-held dropped", res, err)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM runs`); n != 0 {
		t.Fatalf("%d runs left, want 0", n)
	}
}
