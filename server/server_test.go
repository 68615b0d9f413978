package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/localpg"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

const (
	ingestToken = "ingest-token-0123456789"
	readToken   = "read-token-0123456789"
)

// running is a server answering on 127.0.0.1.
type running struct {
	srv  *Server
	url  string
	stop context.CancelFunc
	done chan error
}

// start serves srv on a free 127.0.0.1 port until the test ends.
func start(t testing.TB, srv *Server) *running {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{srv: srv, url: "http://" + l.Addr().String(), stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- srv.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

func testConfig() Config {
	c := DefaultConfig()
	c.Listen = "127.0.0.1:0"
	c.ShutdownTimeout = 30 * time.Second
	return c
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(&testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// do sends a request and returns the status and body.
func do(t testing.TB, method, url, token, body string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/x-ndjson")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b, res.Header
}

// wantJSONError checks that body is an api.Error with a message.
func wantJSONError(t *testing.T, body []byte) api.Error {
	t.Helper()
	var e api.Error
	if err := json.Unmarshal(body, &e); err != nil || e.Error == "" {
		t.Fatalf("body is not a JSON error: %q (%v)", body, err)
	}
	return e
}

// waitFor waits for cond, checked every 100 ms, for as long as a machine
// loaded by other work may take another process (a standby replaying, a
// query server refreshing) to get there: minutes, not the seconds it
// takes on an idle one.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitRollups waits until run's rollups have caught up with its raw rows
// (its summary carries no rollup_lag), as servertest.WaitRollups does: a
// read waits for the refresher only within its budget, which a loaded
// machine can pass, so a test reading rolled-up views right after loading
// a large run waits here first.
func waitRollups(t *testing.T, r *running, run string) {
	t.Helper()
	waitFor(t, "the rollups of "+run, func() bool {
		code, b, _ := do(t, "GET", r.url+"/api/v1/runs/"+run, "", "")
		var d struct {
			RollupLag *json.RawMessage `json:"rollup_lag"`
		}
		return code == 200 && json.Unmarshal(b, &d) == nil && d.RollupLag == nil
	})
}

// waitDeadline bounds waitFor.
const waitDeadline = 3 * time.Minute

const stepRecord = `{"kind":"step","run_id":"auth-run","rank":0,"step":1,"time":"2026-01-01T00:00:00Z","loss":1.5}` + "\n"

func TestAuth(t *testing.T) {
	st := storetest.NewStore(t)
	cfg := testConfig()
	cfg.IngestTokens = []string{ingestToken}
	cfg.ReadTokens = []string{readToken}
	r := start(t, New(cfg, st, testLogger(t)))

	cases := []struct {
		name, method, path, token string
		body                      string
		want                      int // 0: anything but 401 and 403
	}{
		{"read without token", "GET", "/api/v1/runs", "", "", 401},
		{"read with wrong token", "GET", "/api/v1/runs", "nope-nope-nope", "", 401},
		{"read with a prefix of a token", "GET", "/api/v1/runs", readToken[:10], "", 401},
		{"ingest without token", "POST", "/api/v1/ingest", "", stepRecord, 401},
		{"ingest with wrong token", "POST", "/api/v1/ingest", "nope-nope-nope", stepRecord, 401},
		{"ingest with read token", "POST", "/api/v1/ingest", readToken, stepRecord, 403},
		{"import with read token", "POST", "/api/v1/import", readToken, `{}`, 403},
		{"unknown API route without token", "GET", "/api/v1/nothing-here", "", "", 401},
		{"read with read token", "GET", "/api/v1/runs", readToken, "", 0},
		{"read with ingest token", "GET", "/api/v1/runs", ingestToken, "", 0},
		{"API document needs no token", "GET", "/api/v1/openapi.json", "", "", 200},
		{"health needs no token", "GET", "/healthz", "", "", 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body, hdr := do(t, c.method, r.url+c.path, c.token, c.body)
			switch {
			case c.want == 0 && (code == 401 || code == 403):
				t.Fatalf("status %d, want the request let through: %s", code, body)
			case c.want != 0 && code != c.want:
				t.Fatalf("status %d, want %d: %s", code, c.want, body)
			}
			if code == 401 {
				wantJSONError(t, body)
				if !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("401 without WWW-Authenticate: Bearer")
				}
			}
			if code == 403 {
				wantJSONError(t, body)
			}
		})
	}
	// Refused writes stored nothing.
	var n int
	if err := storetest.Pool(t, st).QueryRow(context.Background(), `SELECT (SELECT count(*) FROM steps) + (SELECT count(*) FROM runs)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d rows written by refused requests", n)
	}
}

func TestOpenModeNeedsNoToken(t *testing.T) {
	st := storetest.NewStore(t)
	r := start(t, New(testConfig(), st, testLogger(t)))
	for _, path := range []string{"/api/v1/runs", "/api/v1/openapi.json"} {
		if code, body, _ := do(t, "GET", r.url+path, "", ""); code == 401 || code == 403 {
			t.Fatalf("GET %s in open mode: %d %s", path, code, body)
		}
	}
}

func TestTokenScopes(t *testing.T) {
	a := newAuthenticator([]string{"i1-aaaaaaaa", "i2-bbbbbbbb"}, []string{"r1-cccccccc"})
	for tok, want := range map[string]string{
		"i1-aaaaaaaa": ScopeIngest, "i2-bbbbbbbb": ScopeIngest, "r1-cccccccc": ScopeRead,
		"": "", "i1-aaaaaaa": "", "i1-aaaaaaaaa": "", "R1-CCCCCCCC": "",
	} {
		if got := a.scope(tok); got != want {
			t.Errorf("scope(%q) = %q, want %q", tok, got, want)
		}
	}
	for h, want := range map[string]string{"Bearer abc": "abc", "bearer  abc ": "abc", "Basic abc": "", "Bearer": "", "abc": ""} {
		got, _ := bearerToken(h)
		if got != want {
			t.Errorf("bearerToken(%q) = %q, want %q", h, got, want)
		}
	}
}

// Tokens never reach the log, whatever the request.
func TestTokensNotLogged(t *testing.T) {
	st := storetest.NewStore(t)
	cfg := testConfig()
	cfg.IngestTokens = []string{ingestToken}
	var logged strings.Builder
	log := slog.New(slog.NewJSONHandler(&lockedWriter{w: &logged}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r := start(t, New(cfg, st, log))
	do(t, "GET", r.url+"/api/v1/runs", ingestToken, "")
	do(t, "GET", r.url+"/api/v1/runs", "wrong-token-secret", "")
	do(t, "POST", r.url+"/api/v1/ingest", ingestToken, stepRecord)
	r.stop()
	<-r.done
	r.done <- nil
	out := logged.String()
	if !strings.Contains(out, "/api/v1/runs") {
		t.Fatalf("requests not logged: %s", out)
	}
	for _, secret := range []string{ingestToken, "wrong-token-secret", "Bearer"} {
		if strings.Contains(out, secret) {
			t.Fatalf("log contains %q:\n%s", secret, out)
		}
	}
}

func TestErrorsAreJSONAndMetricsExposed(t *testing.T) {
	st := storetest.NewStore(t)
	srv := New(testConfig(), st, testLogger(t))
	// A handler that panics must give a 500 JSON answer, not a dead process.
	srv.echo.GET("/test-panic", func(c echo.Context) error { panic("boom") })
	r := start(t, srv)

	code, body, hdr := do(t, "GET", r.url+"/no/such/route", "", "")
	if code != 404 || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
		t.Fatalf("unknown route: %d %s %q", code, body, hdr.Get("Content-Type"))
	}
	wantJSONError(t, body)
	code, body, _ = do(t, "GET", r.url+"/api/v1/no-such-route", "", "")
	if code != 404 {
		t.Fatalf("unknown API route: %d %s", code, body)
	}
	wantJSONError(t, body)
	code, body, _ = do(t, "GET", r.url+"/test-panic", "", "")
	if code != 500 {
		t.Fatalf("panic: %d %s", code, body)
	}
	wantJSONError(t, body)
	if code, _, _ := do(t, "GET", r.url+"/healthz", "", ""); code != 200 {
		t.Fatalf("healthz after a panic: %d", code)
	}
	waitFor(t, "ready", func() bool { code, _, _ := do(t, "GET", r.url+"/readyz", "", ""); return code == 200 })

	code, body, _ = do(t, "GET", r.url+"/metrics", "", "")
	if code != 200 {
		t.Fatalf("metrics: %d", code)
	}
	for _, want := range []string{
		`deepseed_http_requests_total{code="200",method="GET",route="/healthz"}`,
		`deepseed_http_requests_total{code="500",method="GET",route="/test-panic"}`,
		`deepseed_http_requests_total{code="404",method="GET",route="unmatched"}`,
		`deepseed_http_request_duration_seconds_count{route="/readyz"}`,
		`deepseed_db_pool_total_conns `,
		`deepseed_db_pool_max_conns `,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// The server comes up without its database, says it is not ready, keeps
// serving, and becomes ready by itself when the database is back.
func TestReadinessFollowsDatabase(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and stops its own PostgreSQL")
	}
	lp := &localpg.Cluster{Dir: filepath.Join(storetest.DataDir(t), "pg")}
	ctx := context.Background()
	if _, err := lp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	port := lp.Port
	t.Cleanup(func() { _ = lp.Stop() })
	// Stop it before the server starts: the server must come up anyway.
	if err := lp.Stop(); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, lp.URL("postgres"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r := start(t, New(testConfig(), st, testLogger(t)))

	ready := func() int {
		code, body, _ := do(t, "GET", r.url+"/readyz", "", "")
		if code != 200 {
			var rd Readiness
			if err := json.Unmarshal(body, &rd); err != nil || rd.Ready || rd.Error == "" {
				t.Fatalf("readyz %d with body %q", code, body)
			}
			// Anyone can ask: the answer names no address or port.
			if strings.Contains(string(body), "127.0.0.1") || strings.Contains(string(body), strconv.Itoa(port)) {
				t.Fatalf("readyz tells the database's address: %s", body)
			}
		}
		return code
	}
	if code := ready(); code != 503 {
		t.Fatalf("readyz with the database down: %d, want 503", code)
	}
	if code, _, _ := do(t, "GET", r.url+"/healthz", "", ""); code != 200 {
		t.Fatalf("healthz with the database down: %d", code)
	}

	// The database appears: migrations are applied in the background.
	lp.Port = port
	if _, err := lp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "readyz 200 after the database appeared", func() bool { return ready() == 200 })
	if ok, err := st.Migrated(ctx); err != nil || !ok {
		t.Fatalf("Migrated = %v, %v", ok, err)
	}

	// It goes away: not ready, still serving.
	if err := lp.Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "readyz 503 after the database stopped", func() bool { return ready() == 503 })
	if code, _, _ := do(t, "GET", r.url+"/healthz", "", ""); code != 200 {
		t.Fatalf("healthz with the database gone: %d", code)
	}

	// It returns: ready again, without a restart.
	if _, err := lp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "readyz 200 after the database returned", func() bool { return ready() == 200 })
}

// Cancelling the context (what SIGTERM does in deepseed serve) stops new
// connections and lets a request in flight finish.
func TestGracefulShutdown(t *testing.T) {
	st := storetest.NewStore(t)
	srv := New(testConfig(), st, testLogger(t))
	entered, release := make(chan struct{}), make(chan struct{})
	srv.echo.GET("/test-slow", func(c echo.Context) error {
		close(entered)
		<-release
		return c.JSON(http.StatusOK, map[string]string{"done": "yes"})
	})
	r := start(t, srv)

	type result struct {
		code int
		body []byte
	}
	got := make(chan result, 1)
	go func() {
		res, err := http.Get(r.url + "/test-slow")
		if err != nil {
			got <- result{code: -1, body: []byte(err.Error())}
			return
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		got <- result{res.StatusCode, b}
	}()
	<-entered
	r.stop()
	addr := strings.TrimPrefix(r.url, "http://")
	waitFor(t, "the listener to close", func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	select {
	case err := <-r.done:
		t.Fatalf("Serve returned %v while a request was in flight", err)
	default:
	}
	close(release)
	res := <-got
	if res.code != 200 || !strings.Contains(string(res.body), "yes") {
		t.Fatalf("in-flight request: %d %s", res.code, res.body)
	}
	if err := <-r.done; err != nil {
		t.Fatalf("Serve after shutdown: %v", err)
	}
	r.done <- nil
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	for field, mut := range map[string]func(*Config){
		"listen":         func(c *Config) { c.Listen = "nope" },
		"role":           func(c *Config) { c.Role = "both" },
		"max-body-bytes": func(c *Config) { c.HTTP.MaxBodyBytes = 0 },
		"straggler-pct":  func(c *Config) { c.StragglerPct = -1 },
		"retention":      func(c *Config) { c.Retention = -time.Hour },
		"compress-after": func(c *Config) { c.CompressAfter = 0 },
	} {
		c := DefaultConfig()
		mut(&c)
		err := c.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: Validate = %v, want a FieldError naming it", field, err)
		}
	}
	// An agent token must name the agents it acts as; the refusal never
	// quotes the token.
	for _, entry := range []string{"s3cret-bare-token", "bad name:s3cret", "node1:", ":s3cret", "*:s3cret"} {
		c := DefaultConfig()
		c.AgentTokens = []string{"node1:fine", entry}
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), "DEEPSEED_AGENT_TOKENS: entry 2") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("agent token %q: Validate = %v", entry, err)
		}
	}
	good := DefaultConfig()
	good.AgentTokens = []string{"node1:a:b", "gpu-*:t", "gpu-login:t"}
	if err := good.Validate(); err != nil {
		t.Errorf("valid agent tokens: %v", err)
	}
	// No token: loopback only, unless InsecureOpen says otherwise.
	for listen, ok := range map[string]bool{"127.0.0.1:8080": true, "localhost:0": true, "[::1]:8080": true,
		":8080": false, "0.0.0.0:8080": false, "[::]:8080": false, "10.0.0.5:8080": false, "myhost:8080": false} {
		c := DefaultConfig()
		c.Listen = listen
		var fe *FieldError
		if err := c.Validate(); ok != (err == nil) || (!ok && (!errors.As(err, &fe) || fe.Field != "listen" ||
			!strings.Contains(err.Error(), "--insecure-open"))) {
			t.Errorf("no token, --listen %s: Validate = %v; want ok %v", listen, err, ok)
		}
		c.InsecureOpen = true
		if err := c.Validate(); err != nil {
			t.Errorf("no token, --insecure-open, --listen %s: %v", listen, err)
		}
		c.InsecureOpen, c.ReadTokens = false, []string{"r"}
		if err := c.Validate(); err != nil {
			t.Errorf("a token, --listen %s: %v", listen, err)
		}
	}
	for in, want := range map[string]time.Duration{"0": 0, "90d": 90 * 24 * time.Hour, "2w": 14 * 24 * time.Hour, "36h": 36 * time.Hour} {
		if got, err := ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseDuration("ninety days"); err == nil {
		t.Error("ParseDuration accepted nonsense")
	}
}

// A query-serving server refreshes the rollups of freshly ingested steps
// by itself, before anyone reads them; an ingest-only replica leaves
// that to the query replicas.
func TestServerRefreshesRollupsInBackground(t *testing.T) {
	ctx := context.Background()
	dirty := func(st *store.Store) int {
		var n int
		if err := storetest.Pool(t, st).QueryRow(ctx, `SELECT count(*) FROM rollup_dirty`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var body strings.Builder
	for i := 0; i < 250; i++ {
		fmt.Fprintf(&body, `{"kind":"step","run_id":"bg-run","rank":0,"step":%d,"time":%d,"loss":%g,"step_ms":100}`+"\n", i, 1767225600+i, 2.0-float64(i)/1000)
	}

	// Both servers get the steps at once; once the query-serving one has
	// refreshed them, a refresher pass has had its time, and the
	// ingest-only replica has still left its own to others.
	ingestOnly := storetest.NewStore(t)
	cfg := testConfig()
	cfg.Role = RoleIngest
	ri := start(t, New(cfg, ingestOnly, testLogger(t)))
	st := storetest.NewStore(t)
	r := start(t, New(testConfig(), st, testLogger(t)))
	for _, url := range []string{ri.url, r.url} {
		waitFor(t, "server ready", func() bool { code, _, _ := do(t, "GET", url+"/readyz", "", ""); return code == 200 })
		if code, b, _ := do(t, "POST", url+"/api/v1/ingest", "", body.String()); code != 200 {
			t.Fatalf("ingest: %d %s", code, b)
		}
	}
	waitFor(t, "rollups refreshed without a read", func() bool { return dirty(st) == 0 })
	if n := dirty(ingestOnly); n == 0 {
		t.Fatal("an ingest-only replica refreshed rollups")
	}
	var buckets int
	if err := storetest.Pool(t, st).QueryRow(ctx, `SELECT count(DISTINCT bucket) FROM metric_rollups WHERE run_id = 'bg-run' AND width = 100`).Scan(&buckets); err != nil {
		t.Fatal(err)
	}
	if buckets != 3 {
		t.Fatalf("width-100 rollup buckets for steps 0–249: %d, want 3", buckets)
	}
}
