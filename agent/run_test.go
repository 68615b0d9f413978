package agent_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deepseed/deepseed/agent"
	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store/storetest"
)

// Real commands through an agent: a hooked Python job that exits 0
// finishes with exit code 0, its output tail and its run linked; one that
// exits 1 fails with exit code 1; one that sleeps is cancelled (SIGTERM,
// then SIGKILL) and frees its GPU.
func TestAgentRunsRealCommands(t *testing.T) {
	e := start(t, 5*time.Second)
	runAgent(t, e, "node1", []int{0, 1})
	waitAgent(t, e, "node1")
	py := script(t)
	ok := e.submit(t, api.JobSubmit{Project: "imdb", Argv: []string{"python3", py, "ok"}, Params: map[string]string{"lr": "2e-5"}})
	fail := e.submit(t, api.JobSubmit{Project: "imdb", Argv: []string{"python3", py, "{mode}"}, Params: map[string]string{"mode": "fail"}})

	j := e.waitJob(t, ok.ID, "finished with its run", linked("finished"))
	if j.ExitCode == nil || *j.ExitCode != 0 || !strings.Contains(j.OutputTail, "lr=2e-5") || len(j.GPUIDs) != 1 {
		t.Errorf("finished job: %+v", j)
	}
	if j.RunID != "job-"+strconv.FormatInt(j.ID, 10) || j.StartedAt == nil || j.EndedAt == nil || j.Agent != "node1" {
		t.Errorf("finished job: run %q, agent %q, times %v %v", j.RunID, j.Agent, j.StartedAt, j.EndedAt)
	}
	var meta, params string
	if err := storetest.Pool(t, e.st).QueryRow(context.Background(), `SELECT meta->>'job_id', params::text FROM runs WHERE run_id = $1`, j.RunID).Scan(&meta, &params); err != nil {
		t.Fatal(err)
	}
	// A parameter that reads as a number reaches the run as one.
	var got map[string]any
	if err := json.Unmarshal([]byte(params), &got); err != nil {
		t.Fatal(err)
	}
	if meta != strconv.FormatInt(j.ID, 10) || got["lr"] != 2e-5 {
		t.Errorf("the run names job %q with params %s", meta, params)
	}
	j = e.waitJob(t, fail.ID, "failed", state("failed"))
	if j.ExitCode == nil || *j.ExitCode != 1 || !strings.Contains(j.OutputTail, "failing on purpose") || j.Argv[2] != "fail" {
		t.Errorf("failed job: %+v", j)
	}

	sleep := e.submit(t, api.JobSubmit{Project: "imdb", Argv: []string{"python3", py, "sleep"}})
	j = e.waitJob(t, sleep.ID, "running with its output", func(j api.Job) bool { return j.State == "running" && j.ExternalID != "" && j.RunID != "" })
	pid, _ := strconv.Atoi(j.ExternalID)
	var c api.Job
	if code := e.call(t, "POST", "/api/v1/jobs/"+strconv.FormatInt(j.ID, 10)+"/cancel", submitTok, nil, &c); code != 200 || !c.CancelRequested {
		t.Fatalf("cancel: %d %+v", code, c)
	}
	j = e.waitJob(t, sleep.ID, "cancelled", state("cancelled"))
	if j.EndedAt == nil || !gone(pid) {
		t.Errorf("cancelled job: %+v; process %d gone: %v", j, pid, gone(pid))
	}
}

func waitAgent(t *testing.T, e *env, name string) {
	t.Helper()
	for deadline := time.Now().Add(agent.WaitDeadline); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var l api.AgentList
		e.call(t, "GET", "/api/v1/agents", readTok, nil, &l)
		for _, a := range l.Agents {
			if a.Name == name && a.Alive {
				return
			}
		}
	}
	t.Fatalf("agent %s never sent a heartbeat", name)
}

// A sweep of 3 x 2 trials on an agent with 2 GPUs runs two at a time,
// never two on one GPU (each job takes a lock file per GPU it is given),
// and every trial finishes with its run linked and its metric ranked.
func TestSweepOnTwoFakeGPUs(t *testing.T) {
	e := start(t, 5*time.Second)
	runAgent(t, e, "node1", []int{0, 1})
	waitAgent(t, e, "node1")
	var sw api.Sweep
	in := api.SweepCreate{Project: "imdb", Argv: []string{"python3", script(t), "sweep", "--lr", "{lr}", "--batch", "{batch}"},
		Params: map[string]string{"lr": "1, 2, 5", "batch": "8,16", "epochs": "3", "lockdir": t.TempDir()}, Metric: "val_accuracy", Goal: "max"}
	if code := e.call(t, "POST", "/api/v1/sweeps", submitTok, in, &sw); code != 201 || len(sw.Trials) != 6 {
		t.Fatalf("create sweep: %d, %d trials", code, len(sw.Trials))
	}
	most := 0
	deadline := time.Now().Add(agent.WaitDeadline)
	for {
		var l api.JobList
		e.call(t, "GET", "/api/v1/jobs?sweep="+sw.ID, readTok, nil, &l)
		most = max(most, l.Counts.Running)
		if l.Counts.Running > 2 {
			t.Fatalf("%d jobs running on 2 GPUs", l.Counts.Running)
		}
		if l.Counts.Done+l.Counts.Failed == 6 {
			if l.Counts.Done != 6 {
				for _, j := range l.Jobs {
					t.Logf("job %d %s: %s %s", j.ID, j.State, j.Detail, j.OutputTail)
				}
				t.Fatalf("counts %+v: want all 6 finished", l.Counts)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sweep not done: %+v", l.Counts)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if most != 2 {
		t.Errorf("at most %d jobs ran at once, want 2", most)
	}
	// The runs may still be sending their last records.
	for deadline := time.Now().Add(agent.WaitDeadline); ; time.Sleep(200 * time.Millisecond) {
		e.call(t, "GET", "/api/v1/sweeps/"+sw.ID, readTok, nil, &sw)
		if sw.Trials[len(sw.Trials)-1].Rank == 6 || time.Now().After(deadline) {
			break
		}
	}
	for i, tr := range sw.Trials {
		if tr.Job.RunID == "" || tr.Rank != i+1 || tr.Best == nil || tr.Final == nil {
			t.Fatalf("trial %d: %+v", i, tr)
		}
		lr, _ := strconv.ParseFloat(tr.Job.Params["lr"], 64)
		b, _ := strconv.ParseFloat(tr.Job.Params["batch"], 64)
		if *tr.Best != lr*b || tr.Job.Params["epochs"] != "3" || tr.Job.Argv[4] != tr.Job.Params["lr"] {
			t.Errorf("trial %d: best %v, params %v, argv %v", i, *tr.Best, tr.Job.Params, tr.Job.Argv)
		}
		if i > 0 && *tr.Best > *sw.Trials[i-1].Best {
			t.Errorf("trial %d ranks below a worse one", i)
		}
	}
	if *sw.Trials[0].Best != 80 {
		t.Errorf("best trial %v, want lr=5 batch=16 (80)", *sw.Trials[0].Best)
	}
}

// child starts an agent as its own process, so that it can be killed
// with SIGKILL.
func child(t *testing.T, e *env, name, dir string) *exec.Cmd {
	t.Helper()
	return childAt(t, e, e.url, name, dir)
}

// childAt is child with the server reached at server.
func childAt(t *testing.T, e *env, server, name, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "AGENT_SERVER="+server, "AGENT_NAME="+name, "AGENT_STATE_DIR="+dir,
		"AGENT_COLLECTOR="+e.collector)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

func kill9(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

// An agent killed with SIGKILL mid-job stops heartbeating: its job is
// marked lost after the timeout and, having a retry left, queued again;
// another agent runs the retry to the end.
func TestAgentKilledJobLostAndRetried(t *testing.T) {
	e := start(t, 2*time.Second)
	marker := filepath.Join(t.TempDir(), "attempted")
	a := child(t, e, "doomed", t.TempDir())
	waitAgent(t, e, "doomed")
	j := e.submit(t, api.JobSubmit{Project: "imdb", Argv: []string{"python3", script(t), "retry", marker}, Retries: 1})
	j = e.waitJob(t, j.ID, "running", func(j api.Job) bool { return j.State == "running" && j.ExternalID != "" })
	t.Cleanup(func() { killGroup(j.ExternalID) })
	for deadline := time.Now().Add(agent.WaitDeadline); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(marker); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatal("the job never started its work")
		}
	}
	kill9(t, a)
	lost := e.waitJob(t, j.ID, "lost", state("lost"))
	if !strings.Contains(lost.Detail, "no heartbeat") || lost.EndedAt == nil {
		t.Errorf("lost job: %+v", lost)
	}
	var l api.JobList
	e.call(t, "GET", "/api/v1/jobs?project=imdb", readTok, nil, &l)
	if l.Counts.Total != 2 || l.Jobs[0].RetryOf == nil || *l.Jobs[0].RetryOf != j.ID || l.Jobs[0].Attempt != 2 || l.Jobs[0].Retries != 0 {
		t.Fatalf("after the loss: %+v", l.Jobs)
	}
	runAgent(t, e, "rescuer", []int{0})
	r := e.waitJob(t, l.Jobs[0].ID, "finished", linked("finished"))
	if r.Agent != "rescuer" || *r.ExitCode != 0 {
		t.Errorf("retry: %+v", r)
	}
}

// A restarted agent re-adopts the job it left running (same pid and start
// time) and forwards a cancel to it; a job killed with SIGKILL, wrapper
// and all, while the agent was down left no exit status: it alone is
// reported lost, and retried as a visible new attempt that runs to its
// end.
func TestAgentRestartReadopts(t *testing.T) {
	e := start(t, 10*time.Second)
	dir := t.TempDir()
	a := child(t, e, "node1", dir)
	waitAgent(t, e, "node1")
	py := script(t)
	marker := filepath.Join(t.TempDir(), "attempted")
	keep := e.submit(t, api.JobSubmit{Project: "imdb", Argv: []string{"python3", py, "sleep"}})
	die := e.submit(t, api.JobSubmit{Project: "imdb", Argv: []string{"python3", py, "retry", marker}, Retries: 1})
	running := func(j api.Job) bool { return j.State == "running" && j.ExternalID != "" }
	keep = e.waitJob(t, keep.ID, "running", running)
	die = e.waitJob(t, die.ID, "running", running)
	t.Cleanup(func() { killGroup(keep.ExternalID); killGroup(die.ExternalID) })
	for deadline := time.Now().Add(agent.WaitDeadline); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(marker); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatal("the job never started its work")
		}
	}
	kill9(t, a)
	killGroup(die.ExternalID)
	child(t, e, "node1", dir)
	d := e.waitJob(t, die.ID, "lost", state("lost"))
	if !strings.Contains(d.Detail, "exit status is unknown") || !strings.Contains(d.Detail, "retried as job") {
		t.Errorf("job that died while the agent was down: %+v", d)
	}
	var l api.JobList
	e.call(t, "GET", "/api/v1/jobs?project=imdb", readTok, nil, &l)
	r := l.Jobs[0]
	if l.Counts.Total != 3 || r.RetryOf == nil || *r.RetryOf != die.ID || r.Attempt != 2 || !strings.Contains(d.Detail, "retried as job "+strconv.FormatInt(r.ID, 10)) {
		t.Fatalf("after the loss: %+v", l.Jobs)
	}
	if r.State == "queued" && !strings.Contains(r.Detail, "attempt 2, retrying job "+strconv.FormatInt(die.ID, 10)) {
		t.Errorf("the retry does not say why it exists: %+v", r)
	}
	if r = e.waitJob(t, r.ID, "finished", state("finished")); *r.ExitCode != 0 {
		t.Errorf("retry: %+v", r)
	}
	if k := e.job(t, keep.ID); k.State != "running" || k.ExternalID != keep.ExternalID {
		t.Fatalf("the surviving job was not re-adopted: %+v", k)
	}
	if code := e.call(t, "POST", "/api/v1/jobs/"+strconv.FormatInt(keep.ID, 10)+"/cancel", submitTok, nil, nil); code != 200 {
		t.Fatalf("cancel: %d", code)
	}
	e.waitJob(t, keep.ID, "cancelled", state("cancelled"))
	pid, _ := strconv.Atoi(keep.ExternalID)
	if !gone(pid) {
		t.Errorf("the re-adopted job's process %d still runs after its cancel", pid)
	}
}

// gone reports whether process pid has ended: no longer listed, or a
// zombie nobody has reaped yet (an orphan's new parent may not reap).
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && len(s) > i+2 && s[i+2] == 'Z'
}

// A command that ends before the agent's first report still ends with its
// own exit code, not as lost; the agent logs the code as a number.
func TestAgentInstantExit(t *testing.T) {
	e := start(t, 5*time.Second)
	logs := runAgent(t, e, "node1", []int{0})
	waitAgent(t, e, "node1")
	for _, code := range []string{"0", "3"} {
		j := e.submit(t, api.JobSubmit{Project: "imdb", Argv: []string{"sh", "-c", "exit " + code}})
		want := "finished"
		if code != "0" {
			want = "failed"
		}
		j = e.waitJob(t, j.ID, want, state(want))
		if j.ExitCode == nil || strconv.Itoa(*j.ExitCode) != code {
			t.Errorf("job exiting %s: %+v", code, j)
		}
		line := "job=" + strconv.FormatInt(j.ID, 10) + " state=" + want + " exit_code=" + code + "\n"
		for deadline := time.Now().Add(agent.WaitDeadline); !strings.Contains(logs.String(), line); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the agent's log has no %q:\n%s", line, logs.String())
			}
		}
	}
}

// An agent whose token the server binds to other names stops at once and
// says what to fix, rather than retrying for ever.
func TestAgentWithAnotherAgentsTokenStops(t *testing.T) {
	e := start(t, 5*time.Second)
	ex, err := agent.NewLocal(t.TempDir(), agent.JobConfig{AllowRoot: true})
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{Server: e.url, Token: agentTok, Name: "impostor", GPUs: []int{0}, Executor: ex,
		StateDir: t.TempDir(), Every: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = a.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), `may not act as agent \"impostor\"`) && !strings.Contains(err.Error(), `may not act as agent "impostor"`) ||
		!strings.Contains(err.Error(), "DEEPSEED_AGENT_TOKENS") || strings.Contains(err.Error(), agentTok) {
		t.Fatalf("Run = %v, want the refusal and what to set", err)
	}
}
