package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deepseed/deepseed/agent"
	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/collector"
	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/server/servertest"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

const childEnv = "DEEPSEED_AGENT_TEST_CHILD"

// TestMain runs an agent instead of the tests when started as a child
// by a test that kills it.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(runChild())
	}
	os.Exit(storetest.Main(m))
}

func runChild() int {
	dir := os.Getenv("AGENT_STATE_DIR")
	ex, err := agent.NewLocal(dir, agent.JobConfig{AllowRoot: true, CollectorURL: os.Getenv("AGENT_COLLECTOR")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	a, err := agent.New(agent.Config{Server: os.Getenv("AGENT_SERVER"), Token: agentTok, Name: os.Getenv("AGENT_NAME"),
		GPUs: []int{0, 1}, Executor: ex, StateDir: dir, Every: 200 * time.Millisecond, Grace: time.Second,
		Log: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := a.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

const (
	ingestTok = "ingest-0123456789"
	readTok   = "read-0123456789"
	submitTok = "submit-0123456789"
	agentTok  = "agent-0123456789"
)

type env struct {
	url       string
	st        *store.Store
	collector string // the node's collector, which forwards the jobs' runs to the server
}

func start(t *testing.T, timeout time.Duration) *env {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatalf("the agent's tests run real Python jobs: %v", err)
	}
	cfg := server.DefaultConfig()
	cfg.IngestTokens, cfg.ReadTokens = []string{ingestTok}, []string{readTok}
	cfg.SubmitTokens, cfg.AgentTokens = []string{submitTok}, []string{"node*:" + agentTok, "rescuer:" + agentTok, "doomed:" + agentTok, "slurm1:" + agentTok}
	cfg.JobHeartbeatTimeout = timeout
	cfg.AlertsEvery = -1
	st := storetest.NewStore(t)
	e := &env{url: servertest.Start(t, cfg, st), st: st}
	e.collector = startCollector(t, e.url)
	// The agent's environment holds what a job must never see: the jobs
	// get an allow-list of it, and send their runs through the node's
	// collector.
	t.Setenv("DEEPSEED_SERVER_URL", e.url)
	t.Setenv("DEEPSEED_TOKEN", ingestTok)
	t.Setenv("DEEPSEED_AGENT_TOKEN", agentTok)
	return e
}

// startCollector runs a node collector forwarding to server until the
// test ends, and returns the URL of its hook receiver.
func startCollector(t *testing.T, server string) string {
	t.Helper()
	c, err := collector.New(collector.Config{Server: server, Token: ingestTok, HookListen: "127.0.0.1:0",
		SpoolDir: t.TempDir(), BatchMaxAge: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: c}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	return "http://" + l.Addr().String()
}

func (e *env) call(t *testing.T, method, path, token string, in, out any) int {
	t.Helper()
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = strings.NewReader(string(b))
	}
	req, _ := http.NewRequest(method, e.url+path, body)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if out != nil && res.StatusCode/100 == 2 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	} else if res.StatusCode/100 != 2 {
		t.Logf("%s %s: %d %s", method, path, res.StatusCode, b)
	}
	return res.StatusCode
}

func (e *env) submit(t *testing.T, in api.JobSubmit) api.Job {
	t.Helper()
	var j api.Job
	if code := e.call(t, "POST", "/api/v1/jobs", submitTok, in, &j); code != 201 {
		t.Fatalf("submit: %d", code)
	}
	return j
}

func (e *env) job(t *testing.T, id int64) api.Job {
	t.Helper()
	var j api.Job
	if code := e.call(t, "GET", "/api/v1/jobs/"+strconv.FormatInt(id, 10), readTok, nil, &j); code != 200 {
		t.Fatalf("get job %d: %d", id, code)
	}
	return j
}

// waitJob waits until the job satisfies ok.
func (e *env) waitJob(t *testing.T, id int64, what string, ok func(api.Job) bool) api.Job {
	t.Helper()
	deadline := time.Now().Add(agent.WaitDeadline)
	for {
		j := e.job(t, id)
		if ok(j) {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %d never %s: %+v", id, what, j)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func state(s string) func(api.Job) bool { return func(j api.Job) bool { return j.State == s } }

func linked(s string) func(api.Job) bool {
	return func(j api.Job) bool { return j.State == s && j.RunID != "" }
}

// logBuffer collects an agent's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runAgent runs an agent in this process until the test ends and returns
// its log.
func runAgent(t *testing.T, e *env, name string, gpus []int) *logBuffer {
	t.Helper()
	logs := &logBuffer{}
	dir := t.TempDir()
	// The tests' jobs run as whoever runs the tests, root included.
	ex, err := agent.NewLocal(dir, agent.JobConfig{AllowRoot: true, CollectorURL: e.collector})
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{Server: e.url, Token: agentTok, Name: name, GPUs: gpus, Executor: ex, StateDir: dir,
		Every: 200 * time.Millisecond, Grace: time.Second, Log: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return logs
}

func script(t *testing.T) string {
	p, err := filepath.Abs("testdata/job.py")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// killGroup ends a job process the test left behind.
func killGroup(ext string) {
	if pid, err := strconv.Atoi(ext); err == nil && pid > 0 {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}
