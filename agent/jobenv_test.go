package agent_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/agent"
	"github.com/deepseed/deepseed/api"
)

// A job that prints its environment, seen through the API as anyone with
// a read token sees it: no token and no server URL of the agent's, but its
// ids, its GPUs, the node's collector and its own working directory under
// the agent's state dir.
func TestJobEnvironmentHoldsNoSecret(t *testing.T) {
	e := start(t, 5*time.Second) // the agent's environment holds DEEPSEED_AGENT_TOKEN, DEEPSEED_TOKEN, DEEPSEED_SERVER_URL
	t.Setenv("SECRET_OF_THE_NODE", "node-secret-0123")
	logs := runAgent(t, e, "node1", []int{0})
	waitAgent(t, e, "node1")
	j := e.submit(t, api.JobSubmit{Project: "imdb", Argv: []string{"sh", "-c", "env; echo cwd=$(pwd)"}, Params: map[string]string{"lr": "2e-5"}})
	j = e.waitJob(t, j.ID, "finished", state("finished"))
	out := j.OutputTail
	for _, secret := range []string{agentTok, ingestTok, "node-secret-0123", "DEEPSEED_TOKEN=", "DEEPSEED_AGENT_TOKEN=", "DEEPSEED_SERVER_URL=", e.url} {
		if strings.Contains(out, secret) {
			t.Errorf("the job's output shows %q:\n%s", secret, out)
		}
	}
	if strings.Contains(logs.String(), agentTok) || strings.Contains(logs.String(), ingestTok) {
		t.Errorf("the agent's log shows a token:\n%s", logs.String())
	}
	// Nor does the server's /metrics, which needs no token.
	res, err := http.Get(e.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, tok := range []string{agentTok, ingestTok, submitTok, readTok} {
		if strings.Contains(string(metrics), tok) {
			t.Errorf("/metrics shows the token %q", tok)
		}
	}
	id := strconv.FormatInt(j.ID, 10)
	for _, want := range []string{"DEEPSEED_JOB_ID=" + id + "\n", "DEEPSEED_RUN_ID=job-" + id + "\n", "DEEPSEED_PARAM_LR=2e-5\n",
		"CUDA_VISIBLE_DEVICES=0\n", "DEEPSEED_COLLECTOR_URL=" + e.collector + "\n", "PATH=" + os.Getenv("PATH") + "\n",
		"/jobs/job-" + id + "\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("the job's output lacks %q:\n%s", want, out)
		}
	}
}

// An agent running as root refuses to run jobs as root unless told so,
// and says which flag to give.
func TestRootAgentRefusesRootJobs(t *testing.T) {
	if os.Geteuid() != 0 {
		_, err := agent.NewLocal(t.TempDir(), agent.JobConfig{RunAs: "root"})
		if err == nil || !strings.Contains(err.Error(), "only an agent running as root") {
			t.Fatalf("a non-root agent asked to run jobs as root: %v", err)
		}
		return
	}
	for _, runAs := range []string{"", "root"} {
		_, err := agent.NewLocal(t.TempDir(), agent.JobConfig{RunAs: runAs})
		if err == nil || !strings.Contains(err.Error(), "--allow-root-jobs") {
			t.Errorf("root agent, run-as %q, no --allow-root-jobs: %v", runAs, err)
		}
	}
	if _, err := agent.NewLocal(t.TempDir(), agent.JobConfig{AllowRoot: true}); err != nil {
		t.Errorf("root agent with --allow-root-jobs: %v", err)
	}
}

// A job of an agent with --run-as runs as that user and group, in a
// working directory of its own that the user owns.
func TestJobRunsAsRunAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("switching to another user needs root")
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody:", err)
	}
	dir := t.TempDir()
	// The test's temporary directory is 0700; the state dir must be one
	// the run-as user may enter.
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	ex, err := agent.NewLocal(dir, agent.JobConfig{RunAs: "nobody"})
	if err != nil {
		t.Fatal(err)
	}
	h, err := ex.Start(context.Background(), agent.Spec{JobID: "7", Argv: []string{"sh", "-c", `echo "uid=$(id -u) gid=$(id -g) home=$HOME user=$USER"; pwd; stat -c owner=%u .`}})
	if err != nil {
		t.Fatal(err)
	}
	var st agent.Status
	for deadline := time.Now().Add(agent.WaitDeadline); ; time.Sleep(20 * time.Millisecond) {
		if st, err = ex.Poll(context.Background(), h); err != nil || st.Ended() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job never ended: %+v", st)
		}
	}
	want := "uid=" + u.Uid + " gid=" + u.Gid + " home=" + u.HomeDir + " user=nobody\n" + filepath.Join(dir, "jobs", "job-7") + "\nowner=" + u.Uid + "\n"
	if err != nil || st.State != agent.StateFinished || st.OutputTail != want {
		t.Fatalf("job as nobody: %+v (%v)\nwant output %q", st, err, want)
	}
	// A state dir the user cannot reach is refused at start, naming the
	// directory in the way.
	closed := filepath.Join(t.TempDir(), "closed")
	if err := os.Mkdir(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.NewLocal(filepath.Join(closed, "agent"), agent.JobConfig{RunAs: "nobody"}); err == nil || !strings.Contains(err.Error(), "cannot enter "+closed) {
		t.Errorf("a state dir out of nobody's reach: %v", err)
	}
}
