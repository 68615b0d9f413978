package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/deepseed/deepseed/api"
)

// groupHelp prints a command group's usage and the flags every one of
// its subcommands takes.
func groupHelp(usage string, k tokenKind) {
	fmt.Println(usage)
	f := newEnvFlags("help")
	addAPIFlags(f, k)
	fmt.Println("\nFlags of every subcommand " + flagsEnvNote + ":")
	for _, s := range f.specs {
		printFlag(os.Stdout, s)
	}
}

// paramFlags collects repeated --param name=value flags.
type paramFlags map[string]string

func (p paramFlags) set(s string) error {
	name, value, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("want name=value, got %q", s)
	}
	if _, dup := p[name]; dup {
		return fmt.Errorf("%s given twice", name)
	}
	p[name] = value
	return nil
}

// JobCommand submits, lists, shows and cancels jobs.
type JobCommand struct{}

const jobUsage = `Usage: deepseed job <submit|list|show|cancel> [flags]

  deepseed job submit --project imdb --gpus 1 [--retries N] [--param k=v] -- python train.py --lr 2e-5
  deepseed job list [--project P] [--sweep S] [--state running]
  deepseed job show ID
  deepseed job cancel ID

Jobs run on the agents (deepseed agent) of their project's GPU nodes. The
command after -- is run as given, never through a shell; {name} in it is
replaced by --param name=value, and each parameter is also set as the
environment variable DEEPSEED_PARAM_<NAME>. Submitting and cancelling need a
token with submit scope. Run "deepseed job <sub> -h" for its flags.`

// Run implements command.
func (c *JobCommand) Run(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		groupHelp(jobUsage, submitToken)
		if len(args) == 0 {
			return errors.New("job: name a subcommand: submit, list, show or cancel")
		}
		return nil
	}
	switch args[0] {
	case "submit":
		return jobSubmit(ctx, args[1:])
	case "list":
		return jobList(ctx, args[1:])
	case "show", "cancel":
		return jobShowCancel(ctx, args[0], args[1:])
	}
	return fmt.Errorf("job: unknown subcommand %q (want submit, list, show or cancel)", args[0])
}

func jobSubmit(ctx context.Context, args []string) error {
	f := newEnvFlags("job submit")
	a := addAPIFlags(f, submitToken)
	project := f.String("project", "DEEPSEED_PROJECT", "", "the job's project (required)")
	gpus := f.String("gpus", "", "1", "how many GPUs the job needs")
	retries := f.String("retries", "", "0", "how often to queue the job again when its agent is lost")
	params := paramFlags{}
	f.Func("param", "name=value, substituted for {name} in the command and set as DEEPSEED_PARAM_<NAME> (repeatable)", params.set)
	f.setUsage("deepseed job submit --project P [--gpus N] [--retries N] [--param k=v] -- COMMAND...", "Queue one job.", "")
	if err := f.parse(args); err != nil {
		return err
	}
	in := api.JobSubmit{Project: *project, Argv: f.fs.Args(), Params: params}
	var err error
	if in.GPUs, err = strconv.Atoi(*gpus); err != nil || in.GPUs < 1 {
		return fmt.Errorf("job submit: --gpus %q: want a whole number of GPUs, 1 or more", *gpus)
	}
	if in.Retries, err = strconv.Atoi(*retries); err != nil {
		return fmt.Errorf("job submit: --retries %q is not a number", *retries)
	}
	if len(in.Argv) == 0 {
		return errors.New("job submit: no command: put it after --, e.g. -- python train.py")
	}
	var j api.Job
	if err := a.call(ctx, http.MethodPost, "/api/v1/jobs", in, &j); err != nil {
		return fmt.Errorf("job submit: %w", err)
	}
	if !*a.json {
		fmt.Printf("job %d queued (project %s, %d GPU(s))\n", j.ID, j.Project, j.GPUs)
	}
	if w := noAgentWarning(ctx, a, j.Project); w != "" {
		fmt.Fprintln(os.Stderr, "deepseed: warning:", w)
	}
	return nil
}

func jobList(ctx context.Context, args []string) error {
	f := newEnvFlags("job list")
	a := addAPIFlags(f, readToken)
	project := f.String("project", "", "", "only jobs of this project")
	sweep := f.String("sweep", "", "", "only jobs of this sweep")
	state := f.String("state", "", "", "only jobs in this state: queued, running, finished, failed, cancelled or lost")
	limit := f.String("limit", "", "100", "most jobs listed, newest first")
	f.setUsage("deepseed job list [flags]", "List jobs, newest first, with the counters of all that match.", "")
	if err := f.parse(args); err != nil {
		return err
	}
	q := url.Values{}
	for k, v := range map[string]string{"project": *project, "sweep": *sweep, "state": *state, "limit": *limit} {
		if v != "" {
			q.Set(k, v)
		}
	}
	var l api.JobList
	if err := a.call(ctx, http.MethodGet, "/api/v1/jobs?"+q.Encode(), nil, &l); err != nil {
		return fmt.Errorf("job list: %w", err)
	}
	if *a.json {
		return nil
	}
	c := l.Counts
	fmt.Printf("%d jobs: %d active, %d done, %d failed (%d lost), %d cancelled\n", c.Total, c.Active, c.Done, c.Failed, c.Lost, c.Cancelled)
	printJobs(l.Jobs)
	return nil
}

func printJobs(jobs []api.Job) {
	t := newTable("ID", "PROJECT", "SWEEP", "STATE", "RUNTIME", "GPU-H", "AGENT", "RUN", "PARAMS")
	for _, j := range jobs {
		t.row(j.ID, j.Project, dash(j.SweepID), j.State, time.Duration(j.RuntimeSeconds)*time.Second,
			fmt.Sprintf("%.2f", j.GPUHours), dash(agentOf(j)), dash(j.RunID), formatParams(j.Params))
	}
	t.flush()
}

func agentOf(j api.Job) string {
	if j.Executor == "slurm" && j.ExternalID != "" {
		return j.Agent + " (slurm " + j.ExternalID + ")"
	}
	return j.Agent
}

func formatParams(p map[string]string) string {
	if len(p) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, k+"="+p[k])
	}
	return strings.Join(parts, " ")
}

func jobShowCancel(ctx context.Context, sub string, args []string) error {
	f := newEnvFlags("job " + sub)
	k := readToken
	if sub == "cancel" {
		k = submitToken
	}
	a := addAPIFlags(f, k)
	f.setUsage("deepseed job "+sub+" [flags] ID", map[string]string{"show": "Show one job.", "cancel": "Cancel a job: a queued one at once, a running one through its agent (SIGTERM, then SIGKILL after a grace period)."}[sub], "")
	if err := f.parse(args); err != nil {
		return err
	}
	if f.fs.NArg() != 1 {
		return fmt.Errorf("job %s: give one job id", sub)
	}
	id := f.fs.Arg(0)
	if _, err := strconv.ParseInt(id, 10, 64); err != nil {
		return fmt.Errorf("job %s: %q is not a job id", sub, id)
	}
	var j api.Job
	method, path := http.MethodGet, "/api/v1/jobs/"+id
	if sub == "cancel" {
		method, path = http.MethodPost, path+"/cancel"
	}
	if err := a.call(ctx, method, path, nil, &j); err != nil {
		return fmt.Errorf("job %s: %w", sub, err)
	}
	if *a.json {
		return nil
	}
	if sub == "cancel" {
		fmt.Printf("job %d: %s (cancel requested)\n", j.ID, j.State)
		return nil
	}
	detail := j.Detail
	if j.State == "queued" && detail == "" {
		detail = noAgentWarning(ctx, a, j.Project)
	}
	exit := "-"
	if j.ExitCode != nil {
		exit = strconv.Itoa(*j.ExitCode)
	}
	printFields([][2]string{
		{"id", strconv.FormatInt(j.ID, 10)}, {"project", j.Project}, {"sweep", dash(j.SweepID)}, {"state", j.State},
		{"command", strings.Join(quoteArgs(j.Argv), " ")}, {"params", formatParams(j.Params)},
		{"gpus", fmt.Sprintf("%d asked, held %v", j.GPUs, j.GPUIDs)}, {"agent", dash(agentOf(j))},
		{"external id", dash(j.ExternalID)}, {"exit code", exit}, {"run", dash(j.RunID)},
		{"attempt", fmt.Sprintf("%d (%d retries left)", j.Attempt, j.Retries)},
		{"runtime", (time.Duration(j.RuntimeSeconds) * time.Second).String()}, {"gpu-hours", fmt.Sprintf("%.3f", j.GPUHours)},
		{"detail", dash(detail)},
	})
	if j.OutputTail != "" {
		fmt.Printf("\noutput (tail):\n%s\n", strings.TrimRight(j.OutputTail, "\n"))
	}
	return nil
}

func quoteArgs(argv []string) []string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\"'$\\") {
			a = strconv.Quote(a)
		}
		out[i] = a
	}
	return out
}
