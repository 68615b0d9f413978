package store_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// mustDecode builds records the way ingest does, from NDJSON lines.
func mustDecode(t *testing.T, lines ...string) []api.Record {
	t.Helper()
	recs, err := api.DecodeBatch([]byte(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	return recs
}

func mustWrite(t *testing.T, s *store.Store, lines ...string) store.WriteResult {
	t.Helper()
	res, err := s.WriteBatch(context.Background(), mustDecode(t, lines...))
	if err != nil {
		t.Fatalf("write batch: %v", err)
	}
	return res
}

func mustCount(t testing.TB, s *store.Store, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := storetest.Pool(t, s).QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// mustExec runs sql on the store's database, failing the test on error.
func mustExec(t testing.TB, s *store.Store, sql string, args ...any) {
	t.Helper()
	if _, err := storetest.Pool(t, s).Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func wantResult(t testing.TB, got store.WriteResult, accepted, dups int) {
	t.Helper()
	if got.Accepted != accepted || got.Duplicates != dups {
		t.Fatalf("result = %d accepted, %d duplicates (by kind %v); want %d, %d", got.Accepted, got.Duplicates, got.ByKind, accepted, dups)
	}
}

var everyKind = []string{
	`{"kind":"run","run_id":"r1","project":"p","name":"bert","meta":{"model":"bert-large"}}`,
	`{"kind":"step","run_id":"r1","rank":0,"step":1,"time":"2025-01-01T00:00:01Z","loss":2.5}`,
	`{"kind":"step","run_id":"r1","rank":1,"step":1,"time":"2025-01-01T00:00:01Z","loss":2.6}`,
	`{"kind":"layers","run_id":"r1","rank":0,"step":1,"time":"2025-01-01T00:00:01Z","names":["a","b"],"forward_ms":[1,2],"backward_ms":[2,4]}`,
	`{"kind":"eval","run_id":"r1","step":1,"time":"2025-01-01T00:00:02Z","loss":2.1,"accuracy":0.5}`,
	`{"kind":"gpu","time":"2025-01-01T00:00:01Z","host":"n1","gpu":0,"util_pct":97,"run_id":"r1"}`,
	`{"kind":"host","time":"2025-01-01T00:00:01Z","host":"n1","cpu_util_pct":40}`,
	`{"kind":"memory","run_id":"r1","time":"2025-01-01T00:00:00Z","parameters_bytes":1e9,"optimizer_bytes":4e9,"optimizer_device":"cpu"}`,
	`{"kind":"event","run_id":"r1","time":"2025-01-01T00:00:03Z","step":1,"type":"checkpoint","text":"saved"}`,
	`{"kind":"process","run_id":"r1","rank":0,"local_rank":0,"pid":1234}`,
	`{"kind":"end","run_id":"r1","time":"2025-01-01T00:10:00Z","status":"finished","summary":{"final_accuracy":0.9}}`,
}

func tableCounts(t *testing.T, s *store.Store) string {
	t.Helper()
	var parts []string
	for _, tbl := range []string{"runs", "steps", "layer_times", "evals", "gpu_samples", "host_samples", "memory_breakdowns", "events", "rollup_dirty"} {
		parts = append(parts, fmt.Sprintf("%s=%d", tbl, mustCount(t, s, "SELECT count(*) FROM "+tbl)))
	}
	return strings.Join(parts, " ")
}

func TestWriteBatchRetryStoresNothingTwice(t *testing.T) {
	s := storetest.NewStore(t)
	res := mustWrite(t, s, everyKind...)
	wantResult(t, res, len(everyKind), 0)
	if res.ByKind["step"] != 2 || res.ByKind["process"] != 1 {
		t.Fatalf("by kind = %v", res.ByKind)
	}
	first := tableCounts(t, s)
	want := "runs=1 steps=2 layer_times=1 evals=1 gpu_samples=1 host_samples=1 memory_breakdowns=1 events=1 rollup_dirty=2"
	if first != want {
		t.Fatalf("after first write: %s\nwant %s", first, want)
	}
	res = mustWrite(t, s, everyKind...)
	// Run, end and process records are updates, not duplicates; every
	// data record is one.
	wantResult(t, res, 3, len(everyKind)-3)
	if again := tableCounts(t, s); again != first {
		t.Fatalf("retry changed the tables: %s\nwas %s", again, first)
	}
}

func TestWriteBatchNewerStepReplaces(t *testing.T) {
	s := storetest.NewStore(t)
	ctx := context.Background()
	mustWrite(t, s,
		`{"kind":"step","run_id":"r","rank":0,"step":7,"time":"2025-01-01T00:00:00Z","loss":1}`,
		`{"kind":"layers","run_id":"r","rank":0,"step":7,"time":"2025-01-01T00:00:00Z","names":["a"],"forward_ms":[1]}`,
		`{"kind":"eval","run_id":"r","step":7,"time":"2025-01-01T00:00:00Z","loss":1}`)
	// The resumed run redoes step 7.
	res := mustWrite(t, s,
		`{"kind":"step","run_id":"r","rank":0,"step":7,"time":"2025-01-02T00:00:00Z","loss":2}`,
		`{"kind":"layers","run_id":"r","rank":0,"step":7,"time":"2025-01-02T00:00:00Z","names":["a"],"forward_ms":[2]}`,
		`{"kind":"eval","run_id":"r","step":7,"time":"2025-01-02T00:00:00Z","loss":2}`)
	wantResult(t, res, 3, 0)
	check := func(want float64) {
		t.Helper()
		var loss, fwd, eloss float64
		var n int
		err := storetest.Pool(t, s).QueryRow(ctx, `SELECT (SELECT count(*) FROM steps) + (SELECT count(*) FROM layer_times) + (SELECT count(*) FROM evals),
			(SELECT loss FROM steps), (SELECT forward_ms[1] FROM layer_times), (SELECT loss FROM evals)`).Scan(&n, &loss, &fwd, &eloss)
		if err != nil {
			t.Fatal(err)
		}
		if n != 3 || loss != want || fwd != want || eloss != want {
			t.Fatalf("rows=%d step loss=%v layer fwd=%v eval loss=%v, want 3 rows of %v", n, loss, fwd, eloss, want)
		}
	}
	check(2)
	// A late copy of the old version changes nothing.
	res = mustWrite(t, s,
		`{"kind":"step","run_id":"r","rank":0,"step":7,"time":"2025-01-01T00:00:00Z","loss":1}`,
		`{"kind":"layers","run_id":"r","rank":0,"step":7,"time":"2025-01-01T00:00:00Z","names":["a"],"forward_ms":[1]}`,
		`{"kind":"eval","run_id":"r","step":7,"time":"2025-01-01T00:00:00Z","loss":1}`)
	wantResult(t, res, 0, 3)
	check(2)
	// Both versions in one batch: the newer one wins.
	res = mustWrite(t, s,
		`{"kind":"step","run_id":"r","rank":0,"step":7,"time":"2025-01-04T00:00:00Z","loss":4}`,
		`{"kind":"step","run_id":"r","rank":0,"step":7,"time":"2025-01-03T00:00:00Z","loss":3}`,
		`{"kind":"layers","run_id":"r","rank":0,"step":7,"time":"2025-01-04T00:00:00Z","names":["a"],"forward_ms":[4]}`,
		`{"kind":"eval","run_id":"r","step":7,"time":"2025-01-04T00:00:00Z","loss":4}`)
	wantResult(t, res, 3, 1)
	check(4)
}

func TestWriteBatchKeepsNonFinite(t *testing.T) {
	s := storetest.NewStore(t)
	mustWrite(t, s,
		`{"kind":"step","run_id":"r","rank":0,"step":1,"time":1735689600,"loss":NaN,"grad_norm":Infinity,"loss_scale":-Infinity,"metrics":{"x":NaN}}`,
		`{"kind":"layers","run_id":"r","rank":0,"step":1,"time":1735689600,"names":["a","b"],"forward_ms":[NaN,Infinity]}`,
		`{"kind":"eval","run_id":"r","step":1,"time":1735689600,"loss":"NaN"}`)
	var loss, gn, ls, f0, f1, el float64
	var metrics string
	err := storetest.Pool(t, s).QueryRow(context.Background(), `SELECT s.loss, s.grad_norm, s.loss_scale, s.metrics::text,
		l.forward_ms[1], l.forward_ms[2], e.loss FROM steps s, layer_times l, evals e`).Scan(&loss, &gn, &ls, &metrics, &f0, &f1, &el)
	if err != nil {
		t.Fatal(err)
	}
	if !math.IsNaN(loss) || !math.IsInf(gn, 1) || !math.IsInf(ls, -1) || !math.IsNaN(f0) || !math.IsInf(f1, 1) || !math.IsNaN(el) {
		t.Fatalf("read back loss=%v grad_norm=%v loss_scale=%v fwd=[%v %v] eval loss=%v", loss, gn, ls, f0, f1, el)
	}
	if metrics != `{"x": "NaN"}` {
		t.Fatalf("metrics = %s", metrics)
	}
}

func TestWriteBatchCreatesUnknownRun(t *testing.T) {
	s := storetest.NewStore(t)
	mustWrite(t, s,
		`{"kind":"step","run_id":"new-run","rank":0,"step":2,"time":"2025-01-01T00:00:05Z"}`,
		`{"kind":"step","run_id":"new-run","rank":0,"step":1,"time":"2025-01-01T00:00:01Z"}`)
	mustWrite(t, s, `{"kind":"step","run_id":"new-run","rank":0,"step":3,"time":"2025-01-01T00:00:09Z"}`)
	var project, status string
	var started, last time.Time
	err := storetest.Pool(t, s).QueryRow(context.Background(), `SELECT project, status, started_at, last_seen_at FROM runs WHERE run_id = 'new-run'`).
		Scan(&project, &status, &started, &last)
	if err != nil {
		t.Fatal(err)
	}
	if project != "default" || status != "running" {
		t.Fatalf("project=%q status=%q, want default, running", project, status)
	}
	if !started.Equal(time.Date(2025, 1, 1, 0, 0, 1, 0, time.UTC)) || !last.Equal(time.Date(2025, 1, 1, 0, 0, 9, 0, time.UTC)) {
		t.Fatalf("started_at=%v last_seen_at=%v, want the first and the last record times", started, last)
	}
}

func TestWriteBatchRunUpsertAndEnd(t *testing.T) {
	s := storetest.NewStore(t)
	ctx := context.Background()
	mustWrite(t, s, `{"kind":"run","run_id":"r","project":"nlp","name":"first","started_at":"2025-01-01T00:00:00Z",`+
		`"meta":{"model":"bert","zero_stage":2,"custom":"x"},"config":{"a":1},"tags":["x","y"]}`)
	mustWrite(t, s,
		`{"kind":"run","run_id":"r","name":"renamed","meta":{"zero_stage":3,"world_size":8}}`,
		`{"kind":"run","run_id":"r","params":{"lr":0.1}}`)
	var project, name, status, meta, config, params string
	var tags []string
	err := storetest.Pool(t, s).QueryRow(ctx, `SELECT project, name, status, meta::text, config::text, params::text, tags FROM runs`).
		Scan(&project, &name, &status, &meta, &config, &params, &tags)
	if err != nil {
		t.Fatal(err)
	}
	if project != "nlp" || name != "renamed" || status != "running" || config != `{"a": 1}` || params != `{"lr": 0.1}` || strings.Join(tags, ",") != "x,y" {
		t.Fatalf("project=%q name=%q status=%q config=%s params=%s tags=%v", project, name, status, config, params, tags)
	}
	if meta != `{"model": "bert", "custom": "x", "world_size": 8, "zero_stage": 3}` {
		t.Fatalf("meta = %s, want the two records merged", meta)
	}
	mustWrite(t, s, `{"kind":"end","run_id":"r","time":"2025-01-01T05:00:00Z","status":"failed","summary":{"error":"oom"}}`)
	var ended time.Time
	var summary string
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT status, ended_at, summary::text FROM runs`).Scan(&status, &ended, &summary); err != nil {
		t.Fatal(err)
	}
	if status != "failed" || !ended.Equal(time.Date(2025, 1, 1, 5, 0, 0, 0, time.UTC)) || summary != `{"error": "oom"}` {
		t.Fatalf("after end: status=%q ended_at=%v summary=%s", status, ended, summary)
	}
}

func TestWriteBatchLayerNamesAligned(t *testing.T) {
	s := storetest.NewStore(t)
	ctx := context.Background()
	mustWrite(t, s, `{"kind":"layers","run_id":"r","rank":0,"step":1,"time":1,"names":["emb","enc.0","head"],"forward_ms":[1,2,3],"backward_ms":[2,4,6]}`)
	// A later record measures a new layer and skips one; names repeat.
	mustWrite(t, s, `{"kind":"layers","run_id":"r","rank":0,"step":2,"time":2,"names":["head","emb","enc.1","relu","relu"],"forward_ms":[30,10,25,7,8]}`)
	var names []string
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT layer_names FROM runs`).Scan(&names); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(names, ","); got != "emb,enc.0,head,enc.1,relu,relu" {
		t.Fatalf("layer_names = %s", got)
	}
	var fwd string
	var bwdNull bool
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT forward_ms::text, backward_ms IS NULL FROM layer_times WHERE step = 2`).Scan(&fwd, &bwdNull); err != nil {
		t.Fatal(err)
	}
	if fwd != "{10,NULL,30,25,7,8}" || !bwdNull {
		t.Fatalf("step 2 forward_ms = %s (backward NULL %v), want {10,NULL,30,25,7,8} aligned to layer_names", fwd, bwdNull)
	}
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT forward_ms::text FROM layer_times WHERE step = 1`).Scan(&fwd); err != nil {
		t.Fatal(err)
	}
	if fwd != "{1,2,3}" {
		t.Fatalf("step 1 forward_ms = %s", fwd)
	}
}

func TestWriteBatchMarksRollupsDirty(t *testing.T) {
	s := storetest.NewStore(t)
	mustWrite(t, s,
		`{"kind":"step","run_id":"r","rank":0,"step":5,"time":1}`,
		`{"kind":"step","run_id":"r","rank":0,"step":99,"time":1}`,
		`{"kind":"step","run_id":"r","rank":0,"step":150,"time":1}`,
		`{"kind":"layers","run_id":"r","rank":1,"step":250,"time":1,"names":["a"],"forward_ms":[1]}`)
	rows, err := storetest.Pool(t, s).Query(context.Background(), `SELECT format('%s/%s/%s', run_id, rank, block) FROM rollup_dirty ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		got = append(got, s)
	}
	if strings.Join(got, " ") != "r/0/0 r/0/1 r/1/2" {
		t.Fatalf("rollup_dirty = %v", got)
	}
}

func TestWriteBatchSamplesMemoryEvents(t *testing.T) {
	s := storetest.NewStore(t)
	ctx := context.Background()
	res := mustWrite(t, s,
		`{"kind":"gpu","time":1,"host":"n1","gpu":0,"util_pct":50}`,
		`{"kind":"gpu","time":1,"host":"n1","gpu":0,"util_pct":50}`,
		`{"kind":"gpu","time":1,"host":"n1","gpu":1,"util_pct":60}`,
		`{"kind":"host","time":1,"host":"n1","cpu_util_pct":10}`,
		`{"kind":"host","time":1,"host":"n1","cpu_util_pct":10}`,
		`{"kind":"event","run_id":"r","time":5,"type":"overflow","text":"loss scale halved"}`,
		`{"kind":"event","run_id":"r","time":5,"type":"overflow","text":"loss scale halved"}`,
		`{"kind":"event","run_id":"r","time":5,"type":"overflow","text":"another"}`,
		`{"kind":"memory","run_id":"r","time":10,"parameters_bytes":1}`,
		`{"kind":"memory","run_id":"r","time":20,"parameters_bytes":2,"optimizer_device":"cpu"}`)
	wantResult(t, res, 6, 4)
	res = mustWrite(t, s, `{"kind":"memory","run_id":"r","time":15,"parameters_bytes":3}`)
	wantResult(t, res, 0, 1)
	var p float64
	var dev string
	var step, rank int
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT parameters_bytes, optimizer_device FROM memory_breakdowns`).Scan(&p, &dev); err != nil {
		t.Fatal(err)
	}
	if p != 2 || dev != "cpu" {
		t.Fatalf("memory = %v on %s, want the newest record (2 on cpu)", p, dev)
	}
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT step, rank FROM events LIMIT 1`).Scan(&step, &rank); err != nil {
		t.Fatal(err)
	}
	if step != -1 || rank != -1 {
		t.Fatalf("event without step/rank stored as %d/%d, want -1/-1", step, rank)
	}
	if got := tableCounts(t, s); !strings.Contains(got, "gpu_samples=2 host_samples=1 memory_breakdowns=1 events=2") {
		t.Fatalf("tables: %s", got)
	}
}

func TestWriteBatchProcessIgnored(t *testing.T) {
	s := storetest.NewStore(t)
	res := mustWrite(t, s, `{"kind":"process","run_id":"r","rank":0,"local_rank":0,"pid":77}`)
	wantResult(t, res, 1, 0)
	if n := mustCount(t, s, `SELECT count(*) FROM runs`); n != 0 {
		t.Fatalf("process record created %d runs", n)
	}
}

func TestWriteBatchStampsMissingTime(t *testing.T) {
	s := storetest.NewStore(t)
	fixed := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	old := api.Now
	api.Now = func() time.Time { return fixed }
	defer func() { api.Now = old }()
	mustWrite(t, s, `{"kind":"step","run_id":"r","rank":0,"step":1}`, `{"kind":"event","run_id":"r","type":"note"}`)
	var st, et time.Time
	if err := storetest.Pool(t, s).QueryRow(context.Background(), `SELECT (SELECT time FROM steps), (SELECT time FROM events)`).Scan(&st, &et); err != nil {
		t.Fatal(err)
	}
	if !st.Equal(fixed) || !et.Equal(fixed) {
		t.Fatalf("times = %v, %v; want %v", st, et, fixed)
	}
}

// Batches racing for the same run must not both insert a step.
func TestWriteBatchConcurrentSameRun(t *testing.T) {
	s := storetest.NewStore(t)
	var lines []string
	for step := 0; step < 200; step++ {
		lines = append(lines, fmt.Sprintf(`{"kind":"step","run_id":"race","rank":0,"step":%d,"time":1000}`, step),
			fmt.Sprintf(`{"kind":"layers","run_id":"race","rank":0,"step":%d,"time":1000,"names":["a","b"],"forward_ms":[1,2]}`, step))
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	accepted, dups := 0, 0
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.WriteBatch(context.Background(), mustDecode(t, lines...))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			accepted += res.Accepted
			dups += res.Duplicates
			mu.Unlock()
		}()
	}
	wg.Wait()
	if accepted != 400 || dups != 5*400 {
		t.Fatalf("accepted %d, duplicates %d; want 400 and 2000", accepted, dups)
	}
	if got := tableCounts(t, s); !strings.HasPrefix(got, "runs=1 steps=200 layer_times=200") {
		t.Fatalf("tables: %s", got)
	}
}

func TestIsUnavailable(t *testing.T) {
	// A port with nothing listening: take one and close it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s, err := store.Open(context.Background(), "postgres://nobody@"+addr+"/nothing?sslmode=disable&connect_timeout=2", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.WriteBatch(context.Background(), mustDecode(t, `{"kind":"step","run_id":"r","rank":0,"step":1}`))
	if err == nil || !store.IsUnavailable(err) {
		t.Fatalf("write to a closed port: err = %v, IsUnavailable = %v; want true", err, store.IsUnavailable(err))
	}
	if store.IsUnavailable(errors.New("store: write steps: invalid input syntax")) || store.IsUnavailable(nil) {
		t.Fatal("IsUnavailable is true for an ordinary error")
	}
	// What passes is retried (503); what the batch itself causes is not.
	for code, want := range map[string]bool{
		"53100": true, "53200": true, "53300": true, "53400": true, "57P03": true, "25006": true,
		"40001": true, "40P01": true, "08006": true, "58030": true, "55P03": true,
		"22003": false, "23502": false, "42601": false, "54000": false,
	} {
		err := fmt.Errorf("store: write steps: %w", &pgconn.PgError{Code: code})
		if got := store.IsUnavailable(err); got != want {
			t.Errorf("IsUnavailable(SQLSTATE %s) = %v, want %v", code, got, want)
		}
		if want && store.IsDataError(err) {
			t.Errorf("SQLSTATE %s is both passing and the data's fault", code)
		}
	}
}
