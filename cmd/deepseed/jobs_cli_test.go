package main

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/server/servertest"
	"github.com/deepseed/deepseed/store/storetest"
)

// The job commands with a real agent: --gpus 0 is refused rather than
// becoming 1; a job queued while no live agent serves its project says so
// at submit and in job show, with since when; a parameter that is a
// number reaches the job's DEEPSEED_PARAMS as a number; and quota show
// does not round a small usage to 0.00 next to "exceeded".
func TestJobCommandsSayWhatHappens(t *testing.T) {
	st := storetest.Open(t, storetest.NewDatabase(t), nil)
	cfg := server.DefaultConfig()
	cfg.SubmitTokens = []string{"submit-tok"}
	cfg.AgentTokens = []string{"node1:agent-tok"}
	cfg.JobHeartbeatTimeout = 3 * time.Second
	base := servertest.Start(t, cfg, st)
	env := []string{"DEEPSEED_TOKEN=submit-tok", "DEEPSEED_SERVER_URL=" + base}

	for _, sub := range []string{"job submit", "sweep create"} {
		args := append(strings.Fields(sub), "--project", "p", "--gpus", "0", "--param", "lr=1,2", "--", "true")
		code, _, stderr := runBinary(t, env, args...)
		oneLine(t, sub+" --gpus 0", code, stderr, nil, "--gpus \"0\"", "1 or more")
	}

	state := storetest.DataDir(t)
	startAgent := func() (stop func(), logs *syncBuffer) {
		agent := exec.Command(binary(t), "agent", "--name", "node1", "--fake-gpus", "1", "--state-dir", state,
			"--allow-root-jobs", "--every", "100ms", "--server", base)
		agent.Env = append(cleanEnv(), "DEEPSEED_AGENT_TOKEN=agent-tok")
		logs = &syncBuffer{}
		agent.Stdout, agent.Stderr = logs, logs
		if err := agent.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { agent.Wait(); close(done) }()
		stop = func() { _ = agent.Process.Signal(syscall.SIGTERM); <-done }
		t.Cleanup(stop)
		return stop, logs
	}
	alive := func() bool {
		req, _ := http.NewRequest(http.MethodGet, base+"/api/v1/agents", nil)
		req.Header.Set("Authorization", "Bearer submit-tok")
		var l api.AgentList
		if res, err := http.DefaultClient.Do(req); err == nil {
			_ = json.NewDecoder(res.Body).Decode(&l)
			res.Body.Close()
		}
		return len(l.Agents) == 1 && l.Agents[0].Alive
	}
	waitFor := func(what string, cond func() bool) {
		deadline := time.Now().Add(2 * time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("gave up waiting for %s", what)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// The project's only agent runs, then dies: a job queued now says
	// that no live agent serves the project, which one was last heard
	// from, and when.
	stop, _ := startAgent()
	waitFor("the agent to be alive", alive)
	stop()
	waitFor("the agent to be dead", func() bool { return !alive() })
	code, stdout, stderr := runBinary(t, env, "job", "submit", "--project", "p", "--param", "lr=0.05", "--param", "tag=a1",
		"--", "sh", "-c", "echo PARAMS=$DEEPSEED_PARAMS")
	m := regexp.MustCompile(`^job (\d+) queued`).FindStringSubmatch(stdout)
	const warn = "no live agent serves project p: the last, node1, was last heard from at"
	if code != 0 || m == nil || !strings.Contains(stderr, warn) {
		t.Fatalf("job submit with the only agent dead: exit %d, stdout %q, stderr %q; want it queued with a warning", code, stdout, stderr)
	}
	id := m[1]
	_, stdout, _ = runBinary(t, env, "job", "show", id)
	if !regexp.MustCompile(`detail\s+` + warn).MatchString(stdout) {
		t.Errorf("job show of a job no live agent can take:\n%s", stdout)
	}

	_, logs := startAgent()
	j := waitJob(t, base, id, func(j api.Job) bool { return j.State == "finished" || j.State == "failed" }, logs)
	if j.State != "finished" || !strings.Contains(j.OutputTail, `"lr":0.05`) || !strings.Contains(j.OutputTail, `"tag":"a1"`) {
		t.Errorf("job %s: state %s, output %q; want DEEPSEED_PARAMS with lr a number and tag a string", id, j.State, j.OutputTail)
	}

	code, _, stderr = runBinary(t, env, "quota", "set", "p", "--gpu-hours", "0.0000001")
	if code != 0 {
		t.Fatalf("quota set: exit %d: %s", code, stderr)
	}
	_, stdout, _ = runBinary(t, env, "quota", "show", "p")
	if !strings.Contains(stdout, "exceeded") || regexp.MustCompile(`(?m)^p\s+0\.00\s`).MatchString(stdout) {
		t.Errorf("quota show of a tiny usage over its limit:\n%s", stdout)
	}
}

// waitJob polls job id until done says so, with a generous deadline.
func waitJob(t *testing.T, base, id string, done func(api.Job) bool, logs *syncBuffer) api.Job {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		req, _ := http.NewRequest(http.MethodGet, base+"/api/v1/jobs/"+id, nil)
		req.Header.Set("Authorization", "Bearer submit-tok")
		var j api.Job
		if res, err := http.DefaultClient.Do(req); err == nil {
			_ = json.NewDecoder(res.Body).Decode(&j)
			res.Body.Close()
			if done(j) {
				return j
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s never got there (state %q); agent log:\n%s", id, j.State, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
