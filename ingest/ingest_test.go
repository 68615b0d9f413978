package ingest_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/internal/promtest"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

// server is the ingest API on a real HTTP server over a real database.
type server struct {
	URL     string
	Store   *store.Store
	Handler *ingest.Handler // its metrics, as the server writes them
}

func newServer(t testing.TB, opt ingest.Options) *server {
	t.Helper()
	return newServerOn(t, storetest.NewStore(t), opt)
}

func newServerOn(t testing.TB, s *store.Store, opt ingest.Options) *server {
	t.Helper()
	e := echo.New()
	e.HideBanner = true
	h := ingest.New(s, opt)
	h.Register(e.Group("/api/v1"))
	ts := httptest.NewServer(e)
	t.Cleanup(ts.Close)
	return &server{URL: ts.URL, Store: s, Handler: h}
}

type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r response) result(t *testing.T) api.IngestResult {
	t.Helper()
	if r.Status != http.StatusOK {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	var res api.IngestResult
	if err := json.Unmarshal(r.Body, &res); err != nil {
		t.Fatalf("decode result %s: %v", r.Body, err)
	}
	return res
}

func (r response) apiError(t *testing.T, status int) api.Error {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	var e api.Error
	if err := json.Unmarshal(r.Body, &e); err != nil || e.Error == "" {
		t.Fatalf("error body %q is not a JSON api.Error: %v", r.Body, err)
	}
	return e
}

func (s *server) post(t testing.TB, path string, body []byte, header ...string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, b}
}

func (s *server) ingest(t testing.TB, lines ...string) response {
	t.Helper()
	return s.post(t, "/api/v1/ingest", []byte(strings.Join(lines, "\n")+"\n"))
}

func (s *server) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := storetest.Pool(t, s.Store).QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// stored counts every row ingest can write, to prove a request changed nothing.
func (s *server) stored(t testing.TB) int {
	t.Helper()
	return s.count(t, `SELECT (SELECT count(*) FROM runs) + (SELECT count(*) FROM steps) + (SELECT count(*) FROM layer_times)
		+ (SELECT count(*) FROM evals) + (SELECT count(*) FROM gpu_samples) + (SELECT count(*) FROM host_samples)
		+ (SELECT count(*) FROM memory_breakdowns) + (SELECT count(*) FROM events) + (SELECT count(*) FROM rollup_dirty)`)
}

func gz(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

var allKinds = []string{
	`{"kind":"run","run_id":"r1","project":"nlp","name":"bert","config":{"zero_optimization":{"stage":2}},"meta":{"model":"bert-large","zero_stage":2}}`,
	`{"kind":"step","run_id":"r1","rank":0,"step":1,"time":"2025-01-01T00:00:01Z","loss":0.7,"lr":2e-5,"forward_ms":48,"metrics":{"moe_aux":0.1}}`,
	`{"kind":"layers","run_id":"r1","rank":0,"step":1,"time":"2025-01-01T00:00:01Z","names":["embeddings","encoder.0","classifier"],"forward_ms":[1.5,2.0,0.4],"backward_ms":[3,4,0.8]}`,
	`{"kind":"eval","run_id":"r1","step":1,"time":"2025-01-01T00:00:02Z","loss":0.6,"accuracy":0.8,"f1":0.79}`,
	`{"kind":"gpu","time":"2025-01-01T00:00:01Z","host":"node1","gpu":0,"uuid":"GPU-1","util_pct":97,"mem_used_bytes":1.04e10,"run_id":"r1","rank":0}`,
	`{"kind":"host","time":"2025-01-01T00:00:01Z","host":"node1","cpu_util_pct":35,"mem_used_bytes":3e10}`,
	`{"kind":"memory","run_id":"r1","parameters_bytes":6.7e8,"gradients_bytes":6.7e8,"optimizer_bytes":4.02e9,"optimizer_device":"cpu","activations_bytes":2e8}`,
	`{"kind":"event","run_id":"r1","time":"2025-01-01T00:00:03Z","step":1,"type":"checkpoint","text":"saved global_step1"}`,
	`{"kind":"process","run_id":"r1","rank":0,"local_rank":0,"pid":4242,"host":"node1"}`,
	`{"kind":"end","run_id":"r1","time":"2025-01-01T01:00:00Z","status":"finished","summary":{"final_accuracy":0.93}}`,
}

const allKindsRows = "runs=1 steps=1 layer_times=1 evals=1 gpu_samples=1 host_samples=1 memory_breakdowns=1 events=1"

func (s *server) tables(t testing.TB) string {
	t.Helper()
	var parts []string
	for _, tbl := range []string{"runs", "steps", "layer_times", "evals", "gpu_samples", "host_samples", "memory_breakdowns", "events"} {
		parts = append(parts, fmt.Sprintf("%s=%d", tbl, s.count(t, "SELECT count(*) FROM "+tbl)))
	}
	return strings.Join(parts, " ")
}

func TestIngestNDJSON(t *testing.T) {
	s := newServer(t, ingest.Options{})
	res := s.ingest(t, allKinds...).result(t)
	if res.Accepted != len(allKinds) || res.Duplicates != 0 || res.ByKind["step"] != 1 || res.ByKind["process"] != 1 {
		t.Fatalf("result = %+v", res)
	}
	if got := s.tables(t); got != allKindsRows {
		t.Fatalf("tables: %s\nwant %s", got, allKindsRows)
	}
	var status, project string
	if err := storetest.Pool(t, s.Store).QueryRow(context.Background(), `SELECT status, project FROM runs`).Scan(&status, &project); err != nil {
		t.Fatal(err)
	}
	if status != "finished" || project != "nlp" {
		t.Fatalf("run status=%q project=%q", status, project)
	}
}

func TestIngestJSONArray(t *testing.T) {
	s := newServer(t, ingest.Options{})
	body := "[\n" + strings.Join(allKinds, ",\n") + "\n]"
	res := s.post(t, "/api/v1/ingest", []byte(body), "Content-Type", "application/json").result(t)
	if res.Accepted != len(allKinds) {
		t.Fatalf("result = %+v", res)
	}
	if got := s.tables(t); got != allKindsRows {
		t.Fatalf("tables: %s", got)
	}
}

func TestIngestGzip(t *testing.T) {
	s := newServer(t, ingest.Options{})
	body := gz(t, []byte(strings.Join(allKinds[:4], "\n")))
	res := s.post(t, "/api/v1/ingest", body, "Content-Encoding", "gzip").result(t)
	if res.Accepted != 4 {
		t.Fatalf("gzip with header: %+v", res)
	}
	// Without the header (a proxy dropped it) the magic bytes still tell.
	body = gz(t, []byte(strings.Join(allKinds[4:8], "\n")))
	res = s.post(t, "/api/v1/ingest", body).result(t)
	if res.Accepted != 4 {
		t.Fatalf("gzip without header: %+v", res)
	}
	if got := s.tables(t); got != allKindsRows {
		t.Fatalf("tables: %s", got)
	}
	e := s.post(t, "/api/v1/ingest", []byte{0x1f, 0x8b, 1, 2, 3}, "Content-Encoding", "gzip").apiError(t, http.StatusBadRequest)
	if !strings.Contains(e.Error, "gzip") {
		t.Fatalf("corrupt gzip: %s", e.Error)
	}
}

func TestIngestRetryStoresNothingTwice(t *testing.T) {
	s := newServer(t, ingest.Options{})
	s.ingest(t, allKinds...).result(t)
	before := s.tables(t)
	res := s.ingest(t, allKinds...).result(t)
	// Every data record is a duplicate; run, end and process records
	// re-apply the same values.
	if res.Duplicates != 7 || res.Accepted != 3 {
		t.Fatalf("retry result = %+v, want 7 duplicates", res)
	}
	if after := s.tables(t); after != before {
		t.Fatalf("retry changed the tables: %s, was %s", after, before)
	}
}

func TestIngestNewerStepReplaces(t *testing.T) {
	s := newServer(t, ingest.Options{})
	s.ingest(t, `{"kind":"step","run_id":"r","rank":3,"step":100,"time":"2025-01-01T00:00:00Z","loss":5}`).result(t)
	res := s.ingest(t, `{"kind":"step","run_id":"r","rank":3,"step":100,"time":"2025-01-01T02:00:00Z","loss":4}`).result(t)
	if res.Accepted != 1 || res.Duplicates != 0 {
		t.Fatalf("redone step: %+v", res)
	}
	var loss float64
	if err := storetest.Pool(t, s.Store).QueryRow(context.Background(), `SELECT loss FROM steps WHERE run_id='r' AND rank=3 AND step=100`).Scan(&loss); err != nil {
		t.Fatal(err) // also fails when two rows exist
	}
	if loss != 4 || s.count(t, `SELECT count(*) FROM steps`) != 1 {
		t.Fatalf("loss = %v, want the newer 4 in a single row", loss)
	}
}

func TestIngestNaNAndInfinityKept(t *testing.T) {
	s := newServer(t, ingest.Options{})
	// Exactly what Python's json.dumps writes for float('nan') and float('inf').
	s.ingest(t,
		`{"kind": "step", "run_id": "r", "rank": 0, "step": 1, "loss": NaN, "grad_norm": Infinity, "loss_scale": -Infinity}`,
		`{"kind": "eval", "run_id": "r", "step": 1, "loss": NaN, "accuracy": 0.5}`,
		`{"kind": "layers", "run_id": "r", "rank": 0, "step": 1, "names": ["a", "b"], "forward_ms": [NaN, -Infinity]}`,
	).result(t)
	var loss, gn, ls, el, f1, f2 float64
	err := storetest.Pool(t, s.Store).QueryRow(context.Background(), `SELECT s.loss, s.grad_norm, s.loss_scale, e.loss, l.forward_ms[1], l.forward_ms[2]
		FROM steps s, evals e, layer_times l`).Scan(&loss, &gn, &ls, &el, &f1, &f2)
	if err != nil {
		t.Fatal(err)
	}
	if !math.IsNaN(loss) || !math.IsInf(gn, 1) || !math.IsInf(ls, -1) || !math.IsNaN(el) || !math.IsNaN(f1) || !math.IsInf(f2, -1) {
		t.Fatalf("read back loss=%v grad_norm=%v loss_scale=%v eval loss=%v layers=[%v %v]", loss, gn, ls, el, f1, f2)
	}
	// The array form takes the same tokens.
	s.post(t, "/api/v1/ingest", []byte(`[{"kind":"step","run_id":"r","rank":0,"step":2,"loss":NaN}]`)).result(t)
	if n := s.count(t, `SELECT count(*) FROM steps WHERE loss = 'NaN'::float8`); n != 2 {
		t.Fatalf("%d NaN losses stored, want 2", n)
	}
}

// A batch with one bad record is refused whole, names the record and the
// field, and stores nothing: not even the good records before it.
func TestIngestRejectsBadBatchWhole(t *testing.T) {
	good := []string{
		`{"kind":"run","run_id":"r","project":"p"}`,
		`{"kind":"step","run_id":"r","rank":0,"step":1,"loss":1}`,
	}
	manyNames := make([]string, api.MaxLayers+1)
	manyFwd := make([]string, api.MaxLayers+1)
	for i := range manyNames {
		manyNames[i] = fmt.Sprintf(`"l%d"`, i)
		manyFwd[i] = "1"
	}
	cases := []struct {
		name, line, field, msg string
	}{
		{"unknown kind", `{"kind":"stepz","run_id":"r","step":1}`, "kind", "unknown kind"},
		{"missing kind", `{"run_id":"r","step":1}`, "kind", "missing"},
		{"missing run_id", `{"kind":"step","rank":0,"step":2}`, "run_id", "missing"},
		{"empty run_id", `{"kind":"eval","run_id":"","step":2}`, "run_id", "missing"},
		{"missing step", `{"kind":"step","run_id":"r","rank":0}`, "step", "missing"},
		{"missing layers step", `{"kind":"layers","run_id":"r","rank":0,"names":["a"],"forward_ms":[1]}`, "step", "missing"},
		{"string for number", `{"kind":"step","run_id":"r","rank":0,"step":2,"loss":"low"}`, "loss", "number"},
		{"string for rank", `{"kind":"step","run_id":"r","rank":"0","step":2}`, "rank", "int"},
		{"float step", `{"kind":"step","run_id":"r","rank":0,"step":2.5}`, "step", ""},
		{"object for run_id", `{"kind":"step","run_id":{"a":1},"rank":0,"step":2}`, "run_id", ""},
		{"negative rank", `{"kind":"step","run_id":"r","rank":-1,"step":2}`, "rank", "want 0"},
		{"negative step", `{"kind":"step","run_id":"r","rank":0,"step":-5}`, "step", "want 0"},
		{"negative eval step", `{"kind":"eval","run_id":"r","step":-1}`, "step", "want 0"},
		{"oversized run_id", `{"kind":"step","run_id":"` + strings.Repeat("x", api.MaxIDLen+1) + `","rank":0,"step":2}`, "run_id", "longer than"},
		{"oversized text", `{"kind":"event","run_id":"r","type":"note","text":"` + strings.Repeat("y", api.MaxTextLen+1) + `"}`, "text", "longer than"},
		{"oversized layers", `{"kind":"layers","run_id":"r","rank":0,"step":2,"names":[` + strings.Join(manyNames, ",") + `],"forward_ms":[` + strings.Join(manyFwd, ",") + `]}`, "names", "more than"},
		{"mismatched arrays", `{"kind":"layers","run_id":"r","rank":0,"step":2,"names":["a","b"],"forward_ms":[1]}`, "forward_ms", "entries"},
		{"bad end status", `{"kind":"end","run_id":"r","status":"exploded"}`, "status", "unknown status"},
		{"malformed json", `{"kind":"step","run_id":"r",`, "", "malformed"},
		// A repeated key says two things; neither is taken.
		{"repeated key", `{"kind":"step","run_id":"r","rank":0,"step":2,"loss":1,"loss":2}`, "", `key "loss" appears twice`},
		{"repeated metric", `{"kind":"step","run_id":"r","rank":0,"step":2,"metrics":{"acc":1,"acc":2}}`, "", `key "acc" appears twice`},
		{"repeated run key", `{"kind":"run","run_id":"r","project":"a","project":"b"}`, "", `key "project" appears twice`},
		{"repeated escaped key", `{"kind":"run","run_id":"r","config":{"lr":1,"\u006cr":2}}`, "", `key "lr" appears twice`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newServer(t, ingest.Options{})
			e := s.ingest(t, append(append([]string{}, good...), c.line)...).apiError(t, http.StatusBadRequest)
			if e.Record == nil {
				t.Fatalf("error %q names no record", e.Error)
			}
			if e.Record.Line != 3 || e.Record.Index != 2 {
				t.Fatalf("error names line %d index %d, want line 3 index 2: %s", e.Record.Line, e.Record.Index, e.Error)
			}
			if c.field != "" && e.Record.Field != c.field {
				t.Fatalf("error names field %q, want %q: %s", e.Record.Field, c.field, e.Error)
			}
			if !strings.Contains(e.Error, c.msg) || !strings.Contains(e.Error, "line 3") {
				t.Fatalf("error %q does not say %q at line 3", e.Error, c.msg)
			}
			if n := s.stored(t); n != 0 {
				t.Fatalf("a rejected batch stored %d rows", n)
			}
		})
	}
	t.Run("array index", func(t *testing.T) {
		s := newServer(t, ingest.Options{})
		body := `[` + good[0] + `,` + good[1] + `,{"kind":"step","run_id":"r","rank":-2,"step":1}]`
		e := s.post(t, "/api/v1/ingest", []byte(body)).apiError(t, http.StatusBadRequest)
		if e.Record == nil || e.Record.Index != 2 || e.Record.Field != "rank" || !strings.Contains(e.Error, "record 2") {
			t.Fatalf("error = %s (%+v)", e.Error, e.Record)
		}
		if n := s.stored(t); n != 0 {
			t.Fatalf("a rejected batch stored %d rows", n)
		}
	})
	t.Run("empty body", func(t *testing.T) {
		s := newServer(t, ingest.Options{})
		s.post(t, "/api/v1/ingest", []byte("\n\n")).apiError(t, http.StatusBadRequest)
	})
}

func TestIngestBodyLimit(t *testing.T) {
	s := newServer(t, ingest.Options{MaxBodyBytes: 4096})
	var lines []string
	for i := 0; len(strings.Join(lines, "\n")) <= 4096; i++ {
		lines = append(lines, fmt.Sprintf(`{"kind":"step","run_id":"r","rank":0,"step":%d,"loss":1}`, i))
	}
	body := []byte(strings.Join(lines, "\n"))
	s.post(t, "/api/v1/ingest", body).apiError(t, http.StatusRequestEntityTooLarge)
	// Compressed below the limit, but over it once inflated.
	zbody := gz(t, body)
	if len(zbody) > 4096 {
		t.Fatalf("test body compresses to %d bytes", len(zbody))
	}
	e := s.post(t, "/api/v1/ingest", zbody, "Content-Encoding", "gzip").apiError(t, http.StatusRequestEntityTooLarge)
	if !strings.Contains(e.Error, "4096") {
		t.Fatalf("413 message does not give the limit: %s", e.Error)
	}
	if n := s.stored(t); n != 0 {
		t.Fatalf("an oversized batch stored %d rows", n)
	}
	// Just under the limit goes through.
	s.post(t, "/api/v1/ingest", []byte(strings.Join(lines[:len(lines)-2], "\n"))).result(t)
}

func TestIngestCreatesUnknownRun(t *testing.T) {
	s := newServer(t, ingest.Options{})
	s.ingest(t, `{"kind":"eval","run_id":"never-announced","step":10,"time":"2025-03-01T00:00:00Z","accuracy":0.5}`).result(t)
	var status, project string
	err := storetest.Pool(t, s.Store).QueryRow(context.Background(), `SELECT status, project FROM runs WHERE run_id = 'never-announced'`).Scan(&status, &project)
	if err != nil {
		t.Fatalf("run not created: %v", err)
	}
	if status != "running" || project != "default" {
		t.Fatalf("status %q project %q", status, project)
	}
}

func TestIngestSQLStringsVerbatim(t *testing.T) {
	s := newServer(t, ingest.Options{})
	runID := `r'); DROP TABLE steps; --`
	text := `'; DELETE FROM runs WHERE '1'='1 \N \\ "quoted" ` + "\t tab, ünïcødé, 😀"
	mustJSON := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	s.ingest(t,
		fmt.Sprintf(`{"kind":"run","run_id":%s,"name":%s,"tags":[%s]}`, mustJSON(runID), mustJSON(text), mustJSON("x' OR 1=1")),
		fmt.Sprintf(`{"kind":"step","run_id":%s,"rank":0,"step":1,"metrics":{%s:1}}`, mustJSON(runID), mustJSON(`a"b'c`)),
		fmt.Sprintf(`{"kind":"event","run_id":%s,"type":"note","text":%s}`, mustJSON(runID), mustJSON(text)),
	).result(t)
	var gotRun, gotName, gotText, gotMetrics string
	var tags []string
	err := storetest.Pool(t, s.Store).QueryRow(context.Background(), `SELECT r.run_id, r.name, r.tags, e.text, s.metrics::text
		FROM runs r JOIN events e USING (run_id) JOIN steps s USING (run_id)`).Scan(&gotRun, &gotName, &tags, &gotText, &gotMetrics)
	if err != nil {
		t.Fatal(err)
	}
	if gotRun != runID || gotName != text || gotText != text || len(tags) != 1 || tags[0] != "x' OR 1=1" || gotMetrics != `{"a\"b'c": 1}` {
		t.Fatalf("stored run_id=%q name=%q text=%q tags=%q metrics=%s", gotRun, gotName, gotText, tags, gotMetrics)
	}
}

func TestIngestDatabaseDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	st, err := store.Open(context.Background(), "postgres://deepseed@"+addr+"/deepseed?sslmode=disable&connect_timeout=2", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	s := newServerOn(t, st, ingest.Options{})
	r := s.ingest(t, allKinds[1])
	r.apiError(t, http.StatusServiceUnavailable)
	if r.Header.Get("Retry-After") != "5" {
		t.Fatalf("Retry-After = %q, want 5", r.Header.Get("Retry-After"))
	}
	r = s.post(t, "/api/v1/import", []byte(`{"steps":[{"step":1,"loss":1}]}`))
	r.apiError(t, http.StatusServiceUnavailable)
	if r.Header.Get("Retry-After") != "5" {
		t.Fatalf("import Retry-After = %q, want 5", r.Header.Get("Retry-After"))
	}
}

func TestIngestMetrics(t *testing.T) {
	s := newServer(t, ingest.Options{})
	read := func() string { return s.metricsText(t) }
	value := func(out, name string) float64 {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, name+" ") {
				var v float64
				fmt.Sscan(strings.TrimPrefix(l, name+" "), &v)
				return v
			}
		}
		return 0
	}
	before := read()
	s.ingest(t, allKinds[1], allKinds[3]).result(t)
	s.ingest(t, allKinds[1]).result(t)
	s.ingest(t, `{"kind":"step","run_id":"r","rank":-1,"step":1}`).apiError(t, http.StatusBadRequest)
	after := read()
	for name, want := range map[string]float64{
		`deepseed_ingest_records_total{kind="step"}`:  1,
		`deepseed_ingest_records_total{kind="eval"}`:  1,
		`deepseed_ingest_duplicates_total`:            1,
		`deepseed_ingest_rejected_total{kind="step"}`: 1,
		`deepseed_db_write_duration_seconds_count`:    2,
	} {
		if got := value(after, name) - value(before, name); got != want {
			t.Errorf("%s grew by %v, want %v", name, got, want)
		}
	}
}

// metricsText is the handler's metrics in the Prometheus text format,
// as Prometheus' parser reads them.
func (s *server) metricsText(t testing.TB) string {
	t.Helper()
	var b bytes.Buffer
	if err := s.Handler.WriteMetrics(&b); err != nil {
		t.Fatalf("write metrics: %v", err)
	}
	promtest.Parse(t, b.String())
	return b.String()
}

// A steps record is stored as the step rows it holds, counted as steps,
// and a steps record sent again stores nothing twice.
func TestIngestStepsRecord(t *testing.T) {
	s := newServer(t, ingest.Options{})
	line := `{"kind":"steps","run_id":"r","rank":1,"step":[1,2,3],"time":[1735689600,1735689601,1735689602],` +
		`"step_ms":[2.5,2,1.5],"lr":0.01,"grad_norm":[null,null,0.5],"metrics":{"acc":[0.1,0.2,null]}}`
	res := s.ingest(t, `{"kind":"run","run_id":"r","project":"p"}`, line).result(t)
	if res.Accepted != 4 || res.ByKind["step"] != 3 || res.ByKind["steps"] != 0 {
		t.Fatalf("result = %+v", res)
	}
	rows, err := storetest.Pool(t, s.Store).Query(context.Background(), `SELECT step, step_ms, lr, grad_norm, metrics->>'acc' FROM steps
		WHERE run_id='r' AND rank=1 ORDER BY step`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var step int64
		var ms, lr float64
		var gn *float64
		var acc *string
		if err := rows.Scan(&step, &ms, &lr, &gn, &acc); err != nil {
			t.Fatal(err)
		}
		g, a := "-", "-"
		if gn != nil {
			g = fmt.Sprint(*gn)
		}
		if acc != nil {
			a = *acc
		}
		got = append(got, fmt.Sprintf("%d %v %v %s %s", step, ms, lr, g, a))
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	want := []string{"1 2.5 0.01 - 0.1", "2 2 0.01 - 0.2", "3 1.5 0.01 0.5 -"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("stored %q, want %q", got, want)
	}
	again := s.ingest(t, line).result(t)
	if again.Duplicates != 3 || s.count(t, `SELECT count(*) FROM steps`) != 3 {
		t.Fatalf("sent again: %+v, %d rows", again, s.count(t, `SELECT count(*) FROM steps`))
	}
	// One bad step refuses the whole record, and the batch with it.
	before := s.stored(t)
	e := s.ingest(t, `{"kind":"step","run_id":"r","rank":1,"step":9}`,
		`{"kind":"steps","run_id":"r","rank":1,"step":[4,5],"data_ms":[1,-1]}`).apiError(t, http.StatusBadRequest)
	if e.Record == nil || e.Record.Line != 2 || e.Record.Field != "data_ms" || !strings.Contains(e.Error, "step 5") {
		t.Fatalf("error = %+v", e)
	}
	if s.stored(t) != before {
		t.Fatal("a refused batch changed what is stored")
	}
}
