package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/agent/slurmtest"
)

// printArgv is the job of the argv and env test: it prints its argv (less
// its own name), some variables and its working directory as JSON.
const printArgv = `import json, os, sys
keys = ["DEEPSEED_JOB_ID", "DEEPSEED_RUN_ID", "LR", "WEIRD", "SLURM_JOB_ID", "DEEPSEED_AGENT_TOKEN", "DEEPSEED_TOKEN",
        "DEEPSEED_SERVER_URL", "DEEPSEED_COLLECTOR_URL"]
print(json.dumps({"argv": sys.argv[1:], "env": {k: os.environ.get(k, "") for k in keys}, "dir": os.getcwd()}))
`

// TestSlurmExecutor runs the Slurm executor against a real single-node
// Slurm (slurmctld, slurmd and munged from the machine's packages, two
// GPUs as a generic resource with no devices behind them).
func TestSlurmExecutor(t *testing.T) {
	c := slurmtest.Start(t)
	ex, err := NewSlurm(SlurmConfig{
		Sbatch: c.Bin.Sbatch, Squeue: c.Bin.Squeue, Sacct: c.Bin.Sacct, Scancel: c.Bin.Scancel,
		Env: c.Env, OutputDir: filepath.Join(c.Dir, "jobs"), CommandTimeout: 15 * time.Second,
		Job: JobConfig{AllowRoot: true, CollectorURL: "http://127.0.0.1:9999"},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := func(t *testing.T, spec Spec) Handle {
		t.Helper()
		if spec.JobID == "" {
			spec.JobID = strings.ReplaceAll(t.Name(), "/", "-")
		}
		h, err := ex.Start(ctx, spec)
		if err != nil {
			t.Fatalf("start: %v", err)
		}
		if h.Executor != "slurm" || h.ExternalID == "" || h.OutputPath == "" {
			t.Fatalf("handle %+v: want executor slurm, a Slurm job id and an output path", h)
		}
		return h
	}
	var lastFinished Handle

	t.Run("exit_0_finished", func(t *testing.T) {
		h := start(t, Spec{Name: "imdb/exit0", Argv: []string{"/bin/sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 0"}})
		st := waitEnded(t, ex, h)
		if st.State != StateFinished || st.ExitCode == nil || *st.ExitCode != 0 {
			t.Fatalf("status %+v: want finished with exit code 0", st)
		}
		if !strings.Contains(st.OutputTail, "to-stdout\n") || !strings.Contains(st.OutputTail, "to-stderr\n") {
			t.Errorf("output tail %q: want both stdout and stderr lines", st.OutputTail)
		}
		lastFinished = h
	})

	t.Run("exit_3_failed", func(t *testing.T) {
		h := start(t, Spec{Argv: []string{"/bin/sh", "-c", "echo about to fail; exit 3"}})
		st := waitEnded(t, ex, h)
		if st.State != StateFailed || st.ExitCode == nil || *st.ExitCode != 3 {
			t.Fatalf("status %+v: want failed with exit code 3", st)
		}
		if !strings.Contains(st.Detail, "FAILED") || !strings.Contains(st.OutputTail, "about to fail") {
			t.Errorf("status %+v: want a detail naming Slurm's FAILED and the output", st)
		}
	})

	t.Run("argv_and_env", func(t *testing.T) {
		python, err := exec.LookPath("python3")
		if err != nil {
			t.Skip("python3 prints the job's argv as JSON; not found:", err)
		}
		// The agent's secrets never reach a job: not through sbatch's
		// environment, not through the batch script.
		t.Setenv("DEEPSEED_AGENT_TOKEN", "agent-secret-0123")
		t.Setenv("DEEPSEED_TOKEN", "ingest-secret-0123")
		t.Setenv("DEEPSEED_SERVER_URL", "http://server.invalid")
		items := []string{"two words", `"double"`, "'single'", "$HOME", "a;b", "`id`", "$(id)", "*", "", "line\nbreak", `back\slash`, "--flag=x y"}
		wdir := t.TempDir()
		h := start(t, Spec{
			JobID: "job-7", Name: "imdb/job-7",
			Argv: append([]string{python, "-c", printArgv}, items...),
			Env: []string{"DEEPSEED_JOB_ID=job-7", "DEEPSEED_RUN_ID=run-x",
				"LR=2e-5", "WEIRD=a,b c'd \"e\" $HOME ;f"},
			Dir: wdir,
		})
		st := waitEnded(t, ex, h)
		if st.State != StateFinished {
			t.Fatalf("status %+v: want finished", st)
		}
		var got struct {
			Argv []string          `json:"argv"`
			Env  map[string]string `json:"env"`
			Dir  string            `json:"dir"`
		}
		line := st.OutputTail[strings.Index(st.OutputTail, "{"):]
		line, _, _ = strings.Cut(line, "\n")
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("job output %q: %v", st.OutputTail, err)
		}
		if fmt.Sprintf("%q", got.Argv) != fmt.Sprintf("%q", items) {
			t.Errorf("argv arrived as\n%q\nwant\n%q", got.Argv, items)
		}
		for k, want := range map[string]string{"DEEPSEED_JOB_ID": "job-7", "DEEPSEED_RUN_ID": "run-x", "LR": "2e-5", "WEIRD": "a,b c'd \"e\" $HOME ;f",
			"SLURM_JOB_ID": h.ExternalID, "DEEPSEED_AGENT_TOKEN": "", "DEEPSEED_TOKEN": "", "DEEPSEED_SERVER_URL": "",
			"DEEPSEED_COLLECTOR_URL": "http://127.0.0.1:9999"} {
			if got.Env[k] != want {
				t.Errorf("env %s = %q, want %q", k, got.Env[k], want)
			}
		}
		script, err := os.ReadFile(strings.TrimSuffix(h.OutputPath, ".out") + ".sh")
		if err != nil || strings.Contains(string(script), "secret") || strings.Contains(string(script), "server.invalid") {
			t.Errorf("batch script (%v):\n%s", err, script)
		}
		if got.Dir != wdir {
			t.Errorf("working directory %q, want %q", got.Dir, wdir)
		}
	})

	t.Run("gres_comment_and_pending", func(t *testing.T) {
		h := start(t, Spec{JobID: "job-9", Name: "imdb/job-9", GPUs: 2, Argv: []string{"sleep", "300"}})
		waitState(t, ex, h, StateRunning)
		sctx, cancel := context.WithTimeout(ctx, WaitDeadline)
		defer cancel()
		out, err := c.Command(sctx, c.Bin.Scontrol, "show", "job", "--oneliner", h.ExternalID)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"JobName=imdb/job-9 ", "Comment=deepseed job=job-9 name=imdb/job-9 ", "gres:gpu:2"} {
			if !strings.Contains(out, want) {
				t.Errorf("scontrol show job: no %q in\n%s", want, out)
			}
		}
		// Both GPUs are held: a job asking for one waits, and says why.
		h2 := start(t, Spec{GPUs: 1, Argv: []string{"true"}})
		waitFor(t, ex, h2, func(st Status) bool {
			if st.State != StateQueued {
				t.Fatalf("status %+v: want queued while the GPUs are held", st)
			}
			// Until the scheduler has looked at it, the reason is None.
			return strings.Contains(st.Detail, "PENDING (Resources)")
		})
		// Cancelling a pending job: it never ran.
		if err := ex.Cancel(ctx, h2, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if st := waitEnded(t, ex, h2); st.State != StateCancelled {
			t.Errorf("cancelled pending job: %+v, want cancelled", st)
		}
		if err := ex.Cancel(ctx, h, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		waitEnded(t, ex, h)
	})

	t.Run("cancel_running", func(t *testing.T) {
		marker := filepath.Join(t.TempDir(), "still-running")
		h := start(t, Spec{Argv: []string{"/bin/sh", "-c", "echo started; sleep 300; touch " + marker}})
		waitState(t, ex, h, StateRunning)
		waitOutput(t, ex, h, "started")
		if err := ex.Cancel(ctx, h, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		st := waitEnded(t, ex, h)
		if st.State != StateCancelled {
			t.Fatalf("status %+v: want cancelled", st)
		}
		// SIGTERM ended it, not the SIGKILL that follows the grace.
		if st.ExitCode != nil && *st.ExitCode == 128+9 || strings.Contains(st.Detail, "killed by signal 9") {
			t.Errorf("status %+v: SIGTERM should have ended the job before the grace", st)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Error("the command went on after the cancel")
		}
		// Cancelling again, or a job that is gone, is not an error.
		if err := ex.Cancel(ctx, h, time.Second); err != nil {
			t.Errorf("second cancel: %v", err)
		}
	})

	t.Run("sigterm_ignored_killed_after_grace", func(t *testing.T) {
		// The job ignores SIGTERM (and so does sleep, which inherits
		// that): only Cancel's SIGKILL after the grace ends it.
		h := start(t, Spec{Argv: []string{"/bin/sh", "-c", `trap "" TERM; echo started; while :; do sleep 1; done`}})
		waitOutput(t, ex, h, "started")
		began := time.Now()
		if err := ex.Cancel(ctx, h, time.Second); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(began); d < time.Second {
			t.Errorf("cancel returned after %v, before the 1s grace", d)
		}
		st := waitEnded(t, ex, h)
		// Either the batch script outlived its command (exit status
		// 128+9) or SIGKILL reached it first.
		killed := st.ExitCode != nil && *st.ExitCode == 128+9 || st.ExitCode == nil && strings.Contains(st.Detail, "killed by signal 9")
		if st.State != StateCancelled || !killed {
			t.Errorf("status %+v: want cancelled, the command killed by SIGKILL", st)
		}
	})

	t.Run("cancel_leaves_time_to_clean_up", func(t *testing.T) {
		// A training job saves a checkpoint on SIGTERM: it must not be
		// killed before the grace is over.
		h := start(t, Spec{Argv: []string{"/bin/sh", "-c",
			`trap 'echo got TERM; sleep 1; echo cleaned up; exit 0' TERM; echo started; while :; do sleep 1; done`}})
		waitOutput(t, ex, h, "started")
		if err := ex.Cancel(ctx, h, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		st := waitEnded(t, ex, h)
		if st.State != StateCancelled || !strings.Contains(st.OutputTail, "got TERM\ncleaned up\n") {
			t.Fatalf("status %+v: want cancelled, after the job's own clean-up", st)
		}
	})

	t.Run("more_gpus_than_the_node_has", func(t *testing.T) {
		before, _ := os.ReadDir(filepath.Join(c.Dir, "jobs"))
		_, err := ex.Start(ctx, Spec{JobID: "job-big", GPUs: 3, Argv: []string{"true"}})
		if err == nil || !strings.Contains(err.Error(), "Requested node configuration is not available") || !strings.Contains(err.Error(), "--gres=gpu:3") {
			t.Fatalf("start with 3 GPUs on a 2-GPU node: %v, want sbatch's refusal with its command line", err)
		}
		after, _ := os.ReadDir(filepath.Join(c.Dir, "jobs"))
		if len(after) != len(before) {
			t.Errorf("a refused job left files behind: %d files before, %d after", len(before), len(after))
		}
	})

	t.Run("unknown_job_is_lost", func(t *testing.T) {
		st, err := ex.Poll(ctx, Handle{Executor: "slurm", ExternalID: "4000000", OutputPath: filepath.Join(c.Dir, "jobs", "none.out")})
		if err != nil {
			t.Fatal(err)
		}
		if st.State != StateLost || st.Detail == "" {
			t.Fatalf("status %+v: want lost, with a detail", st)
		}
	})

	t.Run("forgotten_job_read_from_exit_file", func(t *testing.T) {
		if lastFinished.OutputPath == "" {
			t.Skip("exit_0_finished did not run")
		}
		// A job slurmctld has forgotten (past MinJobAge), with accounting
		// disabled: its exit file tells how it ended.
		h := lastFinished
		h.ExternalID = "4000001"
		st, err := ex.Poll(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != StateFinished || st.ExitCode == nil || *st.ExitCode != 0 || !strings.Contains(st.OutputTail, "to-stdout") {
			t.Fatalf("status %+v: want finished with exit code 0 from the exit file", st)
		}
	})

	t.Run("bad_spec_refused_before_sbatch", func(t *testing.T) {
		for _, spec := range []Spec{
			{JobID: "e1"},
			{JobID: "e2", Argv: []string{"true"}, Env: []string{"NOEQUALS"}},
			{JobID: "e3", Argv: []string{"true"}, Env: []string{"BAD-NAME=1"}},
			{JobID: "e4", Argv: []string{"true"}, GPUs: -1},
		} {
			if h, err := ex.Start(ctx, spec); err == nil {
				t.Errorf("start %+v: got handle %+v, want an error", spec, h)
				_ = ex.Cancel(ctx, h, time.Second)
			}
		}
	})
}

// waitState polls until the job is in state (failing if it ends in
// another one first).
func waitState(t *testing.T, ex Executor, h Handle, state string) Status {
	t.Helper()
	return waitFor(t, ex, h, func(st Status) bool {
		if st.Ended() && st.State != state {
			t.Fatalf("job %s ended %+v while waiting for %s", h.ExternalID, st, state)
		}
		return st.State == state
	})
}

func waitEnded(t *testing.T, ex Executor, h Handle) Status {
	t.Helper()
	return waitFor(t, ex, h, Status.Ended)
}

func waitOutput(t *testing.T, ex Executor, h Handle, s string) Status {
	t.Helper()
	return waitFor(t, ex, h, func(st Status) bool { return strings.Contains(st.OutputTail, s) })
}

func waitFor(t *testing.T, ex Executor, h Handle, ok func(Status) bool) Status {
	t.Helper()
	deadline := time.Now().Add(WaitDeadline)
	var st Status
	for time.Now().Before(deadline) {
		var err error
		st, err = ex.Poll(context.Background(), h)
		if err != nil {
			t.Fatalf("poll job %s: %v", h.ExternalID, err)
		}
		if ok(st) {
			return st
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("job %s: last status %+v after %s", h.ExternalID, st, WaitDeadline)
	return st
}
