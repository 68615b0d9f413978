package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/deepseed/deepseed/agent"
	"github.com/deepseed/deepseed/collector/nvml"
)

// AgentCommand runs the job agent of a GPU node.
type AgentCommand struct{}

const agentNotes = `
The agent claims queued jobs of its projects from the server, one job per free
set of GPUs, and runs each through its executor: "local" starts the command as
a process of this node in its own process group, as the --run-as user, in its
own working directory <state-dir>/jobs/job-<id>. A job's environment is built
from an allow-list, never the agent's: PATH, LANG, LC_*, TZ, TMPDIR, CUDA_*,
NCCL_*, NVIDIA_* of the agent's, HOME, USER and LOGNAME of the user it runs
as, DEEPSEED_COLLECTOR_URL, CUDA_VISIBLE_DEVICES set to the GPUs held for it,
and DEEPSEED_JOB_ID, DEEPSEED_RUN_ID, DEEPSEED_SWEEP_ID, DEEPSEED_PROJECT and
DEEPSEED_PARAM_* (the hook links the run to the job). An agent running as
root refuses to start without --run-as or --allow-root-jobs. The token comes
from DEEPSEED_AGENT_TOKEN or --token-file, never the command line. It sends a heartbeat every third of the server's
--job-heartbeat-timeout; jobs of an agent that stays silent longer are marked
lost. A cancel is forwarded as SIGTERM to the job's process group, then
SIGKILL after --grace. Jobs outlive the agent: a restarted agent with the same
--state-dir re-adopts those still running and reports the others. Output goes
to <state-dir>/output/job-<id>.log; its tail is shown on the job.

With --executor slurm each job is submitted with sbatch instead (--gres=gpu:N,
the DeepSeed job id in --comment), followed with squeue and sacct and
cancelled with scancel; Slurm chooses the devices, and --gpus is then the
number of GPU slots the agent keeps submitted at once (docs/jobs-slurm.md).`

// Run implements command.
func (c *AgentCommand) Run(ctx context.Context, args []string) error {
	f := newEnvFlags("agent")
	server := addServerFlag(f)
	tokenFlag := addTokenFlag(f, agentToken)
	host, _ := os.Hostname()
	name := f.String("name", "DEEPSEED_AGENT_NAME", host, "the agent's name, unique among agents")
	gpus := f.String("gpus", "DEEPSEED_AGENT_GPUS", "auto", "GPUs it hands out, e.g. 0,1; auto asks NVML")
	fakeGPUs := f.String("fake-gpus", "DEEPSEED_FAKE_GPUS", "0", "with --gpus auto, pretend the node has this many GPUs (for tests without GPUs)")
	projects := f.String("projects", "DEEPSEED_AGENT_PROJECTS", "", "comma-separated projects whose jobs it takes (default: every project)")
	executor := f.String("executor", "DEEPSEED_AGENT_EXECUTOR", "local", "how jobs run: "+strings.Join(agent.ExecutorNames(), ", "))
	stateDir := f.String("state-dir", "DEEPSEED_AGENT_STATE_DIR", defaultAgentDir(), "where it keeps the jobs it runs, their output and their working directories")
	runAs := f.String("run-as", "DEEPSEED_AGENT_RUN_AS", "", "unprivileged user the jobs run as (the agent must run as root to switch); empty: the agent's own user, refused for root")
	allowRoot := f.Bool("allow-root-jobs", "DEEPSEED_AGENT_ALLOW_ROOT_JOBS", false, "let jobs run as root (an agent running as root without --run-as)")
	collectorURL := f.String("collector-url", "DEEPSEED_COLLECTOR_URL", "", "the node's collector, given to jobs as DEEPSEED_COLLECTOR_URL (empty: the hook's default, http://127.0.0.1:9464)")
	every := f.String("every", "", "2s", "how often it polls its jobs and claims new ones")
	grace := f.String("grace", "DEEPSEED_AGENT_GRACE", "10s", "time between SIGTERM and SIGKILL when a job is cancelled")
	slurmPartition := f.String("slurm-partition", "DEEPSEED_SLURM_PARTITION", "", "with --executor slurm: sbatch --partition")
	slurmAccount := f.String("slurm-account", "DEEPSEED_SLURM_ACCOUNT", "", "with --executor slurm: sbatch --account (where GPU-minute limits live)")
	slurmArgs := f.String("slurm-args", "DEEPSEED_SLURM_ARGS", "", "with --executor slurm: more sbatch options, space-separated, e.g. \"--time=24:00:00 --qos=long\"")
	slurmDir := f.String("slurm-output-dir", "DEEPSEED_SLURM_OUTPUT_DIR", "", "with --executor slurm: batch scripts and job output, on a file system the compute nodes share (default <state-dir>/slurm)")
	f.setUsage("deepseed agent [flags]", "Run queued jobs on this node's GPUs.", agentNotes)
	if err := f.parse(args); err != nil {
		return err
	}
	if f.fs.NArg() > 0 {
		return errors.New("agent: takes no arguments")
	}
	var errs []string
	ids, err := agentGPUs(*gpus, *fakeGPUs)
	if err != nil {
		errs = append(errs, err.Error())
	}
	everyD, err := time.ParseDuration(*every)
	if err != nil || everyD < 100*time.Millisecond {
		errs = append(errs, fmt.Sprintf("invalid --every %q: want a duration of 100ms or more", *every))
	}
	graceD, err := time.ParseDuration(*grace)
	if err != nil || graceD < 0 {
		errs = append(errs, fmt.Sprintf("invalid --grace %q: want a duration such as 10s", *grace))
	}
	newExec, ok := agent.Executors[*executor]
	if !ok {
		errs = append(errs, fmt.Sprintf("invalid --executor %q: want %s", *executor, strings.Join(agent.ExecutorNames(), " or ")))
	}
	if *name == "" {
		errs = append(errs, "invalid --name \"\": give the agent a name")
	}
	base, err := serverURL(*server)
	if err != nil {
		errs = append(errs, err.Error())
	}
	token, err := tokenFlag.value()
	if err != nil {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		return fmt.Errorf("agent: %s", strings.Join(errs, "; "))
	}
	// The agent routes always need a token: without one nothing is set
	// up (no state directory) before saying which one to give.
	if token == "" {
		return tokenFlag.errNoToken("agent")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "agent")
	job := agent.JobConfig{RunAs: *runAs, AllowRoot: *allowRoot, CollectorURL: *collectorURL}
	ex, err := newExec(agent.ExecutorConfig{StateDir: *stateDir, Log: log, Job: job, Slurm: agent.SlurmConfig{
		Partition: *slurmPartition, Account: *slurmAccount, ExtraArgs: strings.Fields(*slurmArgs), OutputDir: *slurmDir}})
	if err != nil {
		return fmt.Errorf("agent: executor %s: %w", *executor, err)
	}
	a, err := agent.New(agent.Config{Server: base.String(), Token: token, Name: *name, GPUs: ids, Projects: splitList(*projects),
		Executor: ex, StateDir: *stateDir, Every: everyD, Grace: graceD, Version: Version, Log: log})
	if err != nil {
		return err
	}
	if *allowRoot && os.Geteuid() == 0 && *runAs == "" {
		log.Warn("jobs run as root (--allow-root-jobs): every job may do anything on this node")
	}
	log.Info("agent starting", "name", *name, "server", base.String(), "gpus", ids, "executor", ex.Name(), "state_dir", *stateDir,
		"run_as", orDefault(*runAs, "the agent's user"))
	return a.Run(ctx)
}

// defaultAgentDir is /var/lib/deepseed/agent for root (a system
// service, whose jobs' run-as user must be able to enter it), else
// <data dir>/agent.
func defaultAgentDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/deepseed/agent"
	}
	return filepath.Join(defaultDataDir(), "agent")
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// agentGPUs reads --gpus: a list of indices, or auto (NVML, else the
// fake count).
func agentGPUs(spec, fake string) ([]int, error) {
	if spec != "auto" {
		var ids []int
		for _, p := range splitList(spec) {
			n, err := strconv.Atoi(p)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("invalid --gpus %q: want auto or indices such as 0,1", spec)
			}
			ids = append(ids, n)
		}
		if len(ids) == 0 {
			return nil, fmt.Errorf("invalid --gpus %q: want auto or indices such as 0,1", spec)
		}
		return ids, nil
	}
	n, err := strconv.Atoi(fake)
	if err != nil || n < 0 {
		return nil, fmt.Errorf("invalid --fake-gpus %q: want a count", fake)
	}
	if n > 0 {
		ids := make([]int, n)
		for i := range ids {
			ids[i] = i
		}
		return ids, nil
	}
	lib := &nvml.Real{}
	if err := lib.Init(); err != nil {
		return nil, fmt.Errorf("--gpus auto: no GPUs found through NVML (%v): give --gpus 0,1 or --fake-gpus N", err)
	}
	defer lib.Shutdown()
	seen := map[int]bool{}
	var ids []int
	for _, d := range lib.Devices() {
		if !seen[d.Index] {
			seen[d.Index] = true
			ids = append(ids, d.Index)
		}
	}
	if len(ids) == 0 {
		return nil, errors.New("--gpus auto: NVML shows no GPU: give --gpus 0,1 or --fake-gpus N")
	}
	return ids, nil
}
