package jobs_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/server/servertest"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

const (
	ingestTok = "ingest-0123456789"
	readTok   = "read-0123456789"
	submitTok = "submit-0123456789"
	agentTok  = "agent-0123456789"
	fleetTok  = "fleet-0123456789" // bound to gpu-* and gpu-login
)

type env struct {
	url string
	st  *store.Store
}

// start serves a real server with one token of each scope.
func start(t testing.TB) *env { t.Helper(); return startWith(t, 3*time.Second) }

// startWith serves a server whose agents' jobs are lost after timeout.
func startWith(t testing.TB, timeout time.Duration) *env {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.IngestTokens, cfg.ReadTokens = []string{ingestTok}, []string{readTok}
	cfg.SubmitTokens, cfg.AgentTokens = []string{submitTok}, []string{"node*:" + agentTok, "a*:" + agentTok, "gpu-*:" + fleetTok, "gpu-login:" + fleetTok}
	cfg.JobHeartbeatTimeout = timeout
	cfg.AlertsEvery = -1
	st := storetest.NewStore(t)
	return &env{url: servertest.Start(t, cfg, st), st: st}
}

func (e *env) do(t *testing.T, method, path, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func (e *env) must(t *testing.T, method, path, token, body string, want int, out any) {
	t.Helper()
	code, b := e.do(t, method, path, token, body)
	if code != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, code, b, want)
	}
	if out != nil {
		if err := json.Unmarshal([]byte(b), out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
}

func (e *env) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := storetest.Pool(t, e.st).QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// beat registers an agent with gpus GPUs serving every project.
func (e *env) beat(t *testing.T, name string, gpus int) {
	t.Helper()
	ids := make([]string, gpus)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	e.must(t, "POST", "/api/v1/agents/"+name+"/heartbeat", agentTok,
		`{"host":"h","gpus":[`+strings.Join(ids, ",")+`],"executor":"local","running":[]}`, 200, nil)
}

// Bad input gets a clear 4xx naming what is wrong, and creates nothing.
func TestBadInputCreatesNothing(t *testing.T) {
	e := start(t)
	e.beat(t, "node1", 2)
	big := `{"project":"p","argv":["x"],"params":{"a":"` + strings.Repeat("1,", 10) + `1","b":"` + strings.Repeat("1,", 10) + `1","c":"` + strings.Repeat("1,", 10) + `1"}}`
	for _, c := range []struct {
		name, method, path, body string
		code                     int
		says                     string
	}{
		{"empty command", "POST", "/api/v1/jobs", `{"project":"p","argv":[]}`, 400, "command is empty"},
		{"blank program", "POST", "/api/v1/jobs", `{"project":"p","argv":[" "]}`, 400, "command is empty"},
		{"no project", "POST", "/api/v1/jobs", `{"argv":["python"]}`, 400, "project"},
		{"bad project", "POST", "/api/v1/jobs", `{"project":"a b","argv":["python"]}`, 400, "project"},
		{"unknown field", "POST", "/api/v1/jobs", `{"project":"p","argv":["python"],"gpu":1}`, 400, "unknown field"},
		{"not json", "POST", "/api/v1/jobs", `{"project":`, 400, "JSON"},
		{"too many gpus for any agent", "POST", "/api/v1/jobs", `{"project":"p","argv":["python"],"gpus":3}`, 422, "most any has is 2"},
		{"negative gpus", "POST", "/api/v1/jobs", `{"project":"p","argv":["python"],"gpus":-1}`, 400, "gpus"},
		{"negative retries", "POST", "/api/v1/jobs", `{"project":"p","argv":["python"],"retries":-1}`, 400, "retries"},
		{"placeholder without param", "POST", "/api/v1/jobs", `{"project":"p","argv":["python","--lr","{lr}"]}`, 400, "{lr}"},
		{"bad param name", "POST", "/api/v1/jobs", `{"project":"p","argv":["python"],"params":{"1x":"2"}}`, 400, "parameter name"},
		{"empty param value", "POST", "/api/v1/jobs", `{"project":"p","argv":["python"],"params":{"lr":""}}`, 400, "empty value"},
		{"NUL in argv", "POST", "/api/v1/jobs", `{"project":"p","argv":["python","a\u0000b"]}`, 400, "NUL"},
		{"sweep without params", "POST", "/api/v1/sweeps", `{"project":"p","argv":["python"],"params":{}}`, 400, "at least one parameter"},
		{"sweep empty value in list", "POST", "/api/v1/sweeps", `{"project":"p","argv":["python"],"params":{"lr":"1e-5,,2e-5"}}`, 400, "empty value"},
		{"sweep grid over 1000", "POST", "/api/v1/sweeps", big, 400, "more than 1000 trials"},
		{"sweep trials over 1000", "POST", "/api/v1/sweeps", `{"project":"p","argv":["python"],"params":{"lr":"1:2"},"trials":1001}`, 400, "trials"},
		{"sweep range without trials", "POST", "/api/v1/sweeps", `{"project":"p","argv":["python"],"params":{"lr":"1e-5:1e-3"}}`, 400, "give trials"},
		{"sweep reversed range", "POST", "/api/v1/sweeps", `{"project":"p","argv":["python"],"params":{"lr":"3:1"},"trials":2}`, 400, "low end"},
		{"sweep log range at zero", "POST", "/api/v1/sweeps", `{"project":"p","argv":["python"],"params":{"lr":"log:0:1"},"trials":2}`, 400, "above 0"},
		{"sweep bad goal", "POST", "/api/v1/sweeps", `{"project":"p","argv":["python"],"params":{"lr":"1"},"goal":"up"}`, 400, "min or max"},
		{"sweep too many gpus", "POST", "/api/v1/sweeps", `{"project":"p","argv":["python"],"params":{"lr":"1,2"},"gpus":8}`, 422, "8 GPUs"},
		{"quota of unknown project", "PUT", "/api/v1/quotas/nobody", `{"gpu_hours":30}`, 404, "unknown project"},
		{"negative quota", "PUT", "/api/v1/quotas/p", `{"gpu_hours":-1}`, 400, "gpu_hours"},
		{"job id not a number", "GET", "/api/v1/jobs/abc", ``, 400, "job id"},
		{"unknown job", "GET", "/api/v1/jobs/999", ``, 404, "job 999"},
		{"cancel unknown job", "POST", "/api/v1/jobs/999/cancel", ``, 404, "job 999"},
		{"unknown sweep", "GET", "/api/v1/sweeps/sw-nope", ``, 404, "sweep sw-nope"},
		{"bad state filter", "GET", "/api/v1/jobs?state=done", ``, 400, "state"},
		{"bad agent name", "POST", "/api/v1/agents/a%20b/claim", `{"free_gpus":[0]}`, 400, "agent name"},
		{"duplicate free gpu", "POST", "/api/v1/agents/node1/claim", `{"free_gpus":[0,0]}`, 400, "twice"},
		{"bad report state", "POST", "/api/v1/agents/node1/jobs/1", `{"state":"done"}`, 400, "state"},
		{"NUL in claim executor", "POST", "/api/v1/agents/node1/claim", `{"free_gpus":[0],"executor":"lo\u0000cal"}`, 400, "executor: holds a NUL"},
		{"NUL in heartbeat host", "POST", "/api/v1/agents/node1/heartbeat", `{"host":"h\u0000","gpus":[0],"executor":"local","running":[]}`, 400, "host: holds a NUL"},
		{"NUL in a param name", "POST", "/api/v1/jobs", `{"project":"p","argv":["python"],"params":{"l\u0000r":"1"}}`, 400, "NUL"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tok := submitTok
			if strings.Contains(c.path, "/agents/") {
				tok = agentTok
			} else if c.method == "GET" {
				tok = readTok
			}
			code, body := e.do(t, c.method, c.path, tok, c.body)
			if code != c.code || !strings.Contains(body, c.says) {
				t.Errorf("%s %s %s: %d %s, want %d saying %q", c.method, c.path, c.body, code, body, c.code, c.says)
			}
		})
	}
	for _, table := range []string{"jobs", "sweeps", "quotas"} {
		if n := e.count(t, table); n != 0 {
			t.Errorf("bad input created %d rows in %s", n, table)
		}
	}
}

// Read tokens see jobs; only submit tokens submit and cancel; only agent
// tokens claim and report; with no submit token configured, nobody submits.
func TestScopes(t *testing.T) {
	e := start(t)
	e.beat(t, "node1", 1)
	var j api.Job
	e.must(t, "POST", "/api/v1/jobs", submitTok, `{"project":"p","argv":["true"]}`, 201, &j)
	id := strconv.FormatInt(j.ID, 10)
	routes := []struct{ method, path, body, scope string }{
		{"GET", "/api/v1/jobs", "", ""},
		{"GET", "/api/v1/jobs/" + id, "", ""},
		{"GET", "/api/v1/quotas", "", ""},
		{"GET", "/api/v1/agents", "", ""},
		{"POST", "/api/v1/jobs", `{"project":"p","argv":["true"]}`, "submit"},
		{"POST", "/api/v1/sweeps", `{"project":"p","argv":["true"],"params":{"a":"1"}}`, "submit"},
		{"PUT", "/api/v1/quotas/p", `{"gpu_hours":100}`, "submit"},
		{"POST", "/api/v1/agents/node2/heartbeat", `{"gpus":[0],"executor":"local","running":[]}`, "agent"},
		{"POST", "/api/v1/agents/node2/claim", `{"free_gpus":[]}`, "agent"},
	}
	tokens := map[string]string{"read": readTok, "ingest": ingestTok, "submit": submitTok, "agent": agentTok, "none": "", "bad": "nope"}
	for _, r := range routes {
		for name, tok := range tokens {
			code, body := e.do(t, r.method, r.path, tok, r.body)
			want := code >= 200 && code < 300
			allowed := name != "none" && name != "bad" && (r.scope == "" || r.scope == name)
			if want != allowed {
				t.Errorf("%s %s with a %s token: %d %s", r.method, r.path, name, code, body)
			}
			if !allowed && name != "none" && name != "bad" && code != http.StatusForbidden {
				t.Errorf("%s %s with a %s token: %d, want 403", r.method, r.path, name, code)
			}
		}
	}
	// Cancel last: it ends the job.
	for _, name := range []string{"read", "ingest", "agent"} {
		if code, _ := e.do(t, "POST", "/api/v1/jobs/"+id+"/cancel", tokens[name], ""); code != http.StatusForbidden {
			t.Errorf("cancel with a %s token: %d, want 403", name, code)
		}
	}
	e.must(t, "POST", "/api/v1/jobs/"+id+"/cancel", submitTok, "", 200, &j)
	if j.State != "cancelled" {
		t.Errorf("a queued job cancelled: state %s", j.State)
	}
	e.must(t, "POST", "/api/v1/jobs/"+id+"/cancel", submitTok, "", 409, nil)
}

// An otherwise open server (no token configured) still refuses to start
// processes for anyone.
func TestOpenServerRefusesJobs(t *testing.T) {
	cfg := server.DefaultConfig()
	cfg.AlertsEvery = -1
	st := storetest.NewStore(t)
	e := &env{url: servertest.Start(t, cfg, st), st: st}
	code, body := e.do(t, "POST", "/api/v1/jobs", "", `{"project":"p","argv":["true"]}`)
	if code != 401 || !strings.Contains(body, "DEEPSEED_SUBMIT_TOKENS") {
		t.Errorf("submit on an open server: %d %s", code, body)
	}
	code, body = e.do(t, "POST", "/api/v1/agents/a/claim", "", `{"free_gpus":[0]}`)
	if code != 401 || !strings.Contains(body, "DEEPSEED_AGENT_TOKENS") {
		t.Errorf("claim on an open server: %d %s", code, body)
	}
}
