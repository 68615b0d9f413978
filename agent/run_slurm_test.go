package agent_test

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/agent"
	"github.com/deepseed/deepseed/agent/slurmtest"
	"github.com/deepseed/deepseed/api"
)

// The agent with --executor slurm, end to end: a hooked Python job
// submitted to the server goes through sbatch on a real Slurm, finishes with
// its exit code, output tail and linked run, and shows its Slurm job id; a
// sleeping job is cancelled through the server and ends cancelled in Slurm.
func TestAgentOnSlurm(t *testing.T) {
	c := slurmtest.Start(t)
	e := start(t, 10*time.Second)
	dir := t.TempDir()
	ex, err := agent.NewSlurm(agent.SlurmConfig{
		Sbatch: c.Bin.Sbatch, Squeue: c.Bin.Squeue, Sacct: c.Bin.Sacct, Scancel: c.Bin.Scancel,
		Env: c.Env, OutputDir: filepath.Join(dir, "slurm"), CommandTimeout: 15 * time.Second,
		Job: agent.JobConfig{AllowRoot: true, CollectorURL: e.collector},
	})
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{Server: e.url, Token: agentTok, Name: "slurm1", GPUs: []int{0, 1}, Executor: ex,
		StateDir: dir, Every: 200 * time.Millisecond, Grace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitAgent(t, e, "slurm1")

	py := script(t)
	ok := e.submit(t, api.JobSubmit{Project: "imdb", Argv: []string{"python3", py, "ok"}, Params: map[string]string{"lr": "3e-5"}})
	j := e.waitJob(t, ok.ID, "finished with its run", linked("finished"))
	if _, err := strconv.Atoi(j.ExternalID); err != nil || j.Executor != "slurm" {
		t.Errorf("job %d: external id %q, executor %q; want a Slurm job id from the slurm executor", j.ID, j.ExternalID, j.Executor)
	}
	if j.ExitCode == nil || *j.ExitCode != 0 || !strings.Contains(j.OutputTail, "lr=3e-5") || j.RunID != "job-"+strconv.FormatInt(j.ID, 10) {
		t.Errorf("finished job: exit %v, run %q, tail %q", j.ExitCode, j.RunID, j.OutputTail)
	}

	sleep := e.submit(t, api.JobSubmit{Project: "imdb", Argv: []string{"python3", py, "sleep"}})
	j = e.waitJob(t, sleep.ID, "running in Slurm with its run", func(j api.Job) bool { return j.State == "running" && j.RunID != "" })
	var cj api.Job
	if code := e.call(t, "POST", "/api/v1/jobs/"+strconv.FormatInt(j.ID, 10)+"/cancel", submitTok, nil, &cj); code != 200 {
		t.Fatalf("cancel: %d", code)
	}
	j = e.waitJob(t, sleep.ID, "cancelled", state("cancelled"))
	st, err := ex.Poll(context.Background(), agent.Handle{Executor: "slurm", ExternalID: j.ExternalID})
	if err != nil || st.State != agent.StateCancelled {
		t.Errorf("Slurm says job %s is %+v (%v); want cancelled", j.ExternalID, st, err)
	}
}
