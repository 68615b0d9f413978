// Package jobstest fills a real DeepSeed server with jobs for tests of
// what reads them (the Grafana plugin, the dashboards): a real agent with
// the local executor runs a small sweep whose trials exit 0 or 1, and the
// finished trials' runs report evaluations, as the hook would.
//
// Usage:
//
//	s := jobstest.Seed(t, jobstest.Server{URL: base, Submit: sub, Agent: ag, Ingest: in}, "imdb")
//	// s.Sweep, s.Jobs, s.Evals: what the frames must show
package jobstest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/agent"
	"github.com/deepseed/deepseed/api"
)

// AgentName is the name of the seed's agent: the server's
// DEEPSEED_AGENT_TOKENS must bind Server.Agent to it (AgentName+":"+token).
const AgentName = "seed-node"

// Server is a running server and a token of each scope the seed needs.
type Server struct {
	URL                   string
	Submit, Agent, Ingest string
}

// Seeded is what Seed made.
type Seeded struct {
	Project string // of the sweep and its quota
	Other   string // of one more job, outside the sweep, with no quota
	Limit   float64
	Sweep   api.Sweep // as created: its id and trials
	Jobs    []api.Job // every job once ended, newest first
	// Evals are the val_accuracy of each finished trial's run by job id:
	// the last reported and the best.
	Evals map[int64]Eval
}

// Eval is a run's metric: its last value and its best.
type Eval struct{ Final, Best float64 }

// Params of the seeded sweep: lr is swept, code is each trial's exit
// status (0 finished, 1 failed). Its metric is val_accuracy, goal max.
var (
	LRs   = []string{"1e-05", "3e-05"}
	Codes = []string{"0", "1"}
)

// accuracy is a finished trial's val_accuracy at its two evaluations: a
// higher learning rate scores better, and the last is below the best.
func accuracy(lr string) (first, last float64) {
	v, _ := strconv.ParseFloat(lr, 64)
	return 0.5 + v*1e4 + 0.05, 0.5 + v*1e4
}

// Seed starts an agent with two fake GPUs on s, creates the sweep in
// project, one job in project+"-other", a quota of 30 GPU-hours on
// project, waits for every job to end, and ingests the finished trials'
// runs. The agent stops when the test ends.
func Seed(t testing.TB, s Server, project string) Seeded {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	// The seed's jobs (sh, true) run as whoever runs the tests, root
	// included.
	exec, err := agent.NewLocal(t.TempDir(), agent.JobConfig{AllowRoot: true})
	if err != nil {
		t.Fatal(err)
	}
	ag, err := agent.New(agent.Config{Server: s.URL, Token: s.Agent, Name: AgentName, GPUs: []int{0, 1},
		Executor: exec, StateDir: t.TempDir(), Every: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- ag.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	out := Seeded{Project: project, Other: project + "-other", Limit: 30, Evals: map[int64]Eval{}}
	waitFor(t, "the agent's first heartbeat", func() bool {
		var l api.AgentList
		call(t, s.URL, "GET", "/api/v1/agents", s.Submit, nil, http.StatusOK, &l)
		return len(l.Agents) > 0
	})
	call(t, s.URL, "POST", "/api/v1/sweeps", s.Submit, api.SweepCreate{
		Project: project, Argv: []string{"sh", "-c", "exit {code}"}, GPUs: 1, Metric: "val_accuracy", Goal: "max",
		Params: map[string]string{"lr": strings.Join(LRs, ","), "code": strings.Join(Codes, ",")},
	}, http.StatusCreated, &out.Sweep)
	call(t, s.URL, "POST", "/api/v1/jobs", s.Submit, api.JobSubmit{Project: out.Other, Argv: []string{"true"}, GPUs: 2},
		http.StatusCreated, nil)
	call(t, s.URL, "PUT", "/api/v1/quotas/"+project, s.Submit, api.QuotaSet{GPUHours: &out.Limit}, http.StatusOK, nil)

	var list api.JobList
	waitFor(t, "every job to end", func() bool {
		call(t, s.URL, "GET", "/api/v1/jobs", s.Submit, nil, http.StatusOK, &list)
		return list.Counts.Total == len(out.Sweep.Trials)+1 && list.Counts.Active == 0
	})

	var records []map[string]any
	for _, j := range list.Jobs {
		if j.SweepID == "" || j.State != "finished" || j.StartedAt == nil || j.EndedAt == nil {
			continue
		}
		run := "job-" + strconv.FormatInt(j.ID, 10)
		first, last := accuracy(j.Params["lr"])
		out.Evals[j.ID] = Eval{Final: last, Best: max(first, last)}
		at := func(d time.Duration) string { return j.StartedAt.Add(d).Format(time.RFC3339Nano) }
		records = append(records,
			map[string]any{"kind": "run", "run_id": run, "project": j.Project, "sweep_id": j.SweepID, "name": "trial " + strconv.FormatInt(j.ID, 10),
				"started_at": at(0), "params": j.Params, "meta": map[string]any{"job_id": strconv.FormatInt(j.ID, 10)}},
			map[string]any{"kind": "eval", "run_id": run, "step": 10, "time": at(time.Millisecond), "split": "val", "accuracy": first, "loss": 1 - first},
			map[string]any{"kind": "eval", "run_id": run, "step": 20, "time": at(2 * time.Millisecond), "split": "val", "accuracy": last, "loss": 1 - last},
			map[string]any{"kind": "end", "run_id": run, "time": j.EndedAt.Format(time.RFC3339Nano), "status": "finished"},
		)
	}
	if len(records) == 0 {
		t.Fatalf("no trial finished: %+v", list.Jobs)
	}
	ingest(t, s, records)
	call(t, s.URL, "GET", "/api/v1/jobs", s.Submit, nil, http.StatusOK, &list)
	out.Jobs = list.Jobs
	return out
}

func waitFor(t testing.TB, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// call sends in as JSON and decodes the answer into out, failing the test
// unless the status is want.
func call(t testing.TB, base, method, path, token string, in any, want int, out any) {
	t.Helper()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, res.StatusCode, b, want)
	}
	if out != nil {
		if err := json.Unmarshal(api.NormalizeJSON(b), out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
}

func ingest(t testing.TB, s Server, records []map[string]any) {
	t.Helper()
	var b strings.Builder
	for _, r := range records {
		line, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/api/v1/ingest", strings.NewReader(b.String()))
	req.Header.Set("Authorization", "Bearer "+s.Ingest)
	req.Header.Set("Content-Type", "application/x-ndjson")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("ingest: %d %s", res.StatusCode, body)
	}
}

// String names the seed in test logs.
func (s Seeded) String() string {
	return fmt.Sprintf("sweep %s of %s: %d trials, %d jobs", s.Sweep.ID, s.Project, len(s.Sweep.Trials), len(s.Jobs))
}
