package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"

	"github.com/deepseed/deepseed/api"
)

// SweepCommand creates sweeps and ranks their trials.
type SweepCommand struct{}

const sweepUsage = `Usage: deepseed sweep <create|show> [flags]

  deepseed sweep create --project imdb --param lr=1e-5,2e-5,5e-5 --param batch=8,16 \
      --param epochs=3 -- python train.py --lr {lr} --batch {batch} --epochs {epochs}
  deepseed sweep create --project imdb --trials 20 --param lr=log:1e-6:1e-4 \
      --param batch=8,16 -- python train.py --lr {lr} --batch {batch}
  deepseed sweep show ID --metric val_accuracy --goal max

A grid sweeps every comma-separated list (a single value stays fixed): the
example queues 3 x 2 = 6 jobs; more than 1000 is refused. With --trials N,
ranges min:max, log:min:max and int:min:max are sampled and lists picked
from at random, N times. Run "deepseed sweep <sub> -h" for its flags.`

// Run implements command.
func (c *SweepCommand) Run(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		groupHelp(sweepUsage, submitToken)
		if len(args) == 0 {
			return errors.New("sweep: name a subcommand: create or show")
		}
		return nil
	}
	switch args[0] {
	case "create":
		return sweepCreate(ctx, args[1:])
	case "show":
		return sweepShow(ctx, args[1:])
	}
	return fmt.Errorf("sweep: unknown subcommand %q (want create or show)", args[0])
}

func sweepCreate(ctx context.Context, args []string) error {
	f := newEnvFlags("sweep create")
	a := addAPIFlags(f, submitToken)
	project := f.String("project", "DEEPSEED_PROJECT", "", "the sweep's project (required)")
	gpus := f.String("gpus", "", "1", "GPUs per trial")
	retries := f.String("retries", "", "0", "how often to queue a trial again when its agent is lost")
	trials := f.String("trials", "", "0", "random search: this many trials (0: the grid)")
	seed := f.String("seed", "", "", "random search seed (default: random)")
	metric := f.String("metric", "", "", "eval metric that ranks the trials by default, e.g. val_accuracy")
	goal := f.String("goal", "", "", "min or max (default: min for a loss, else max)")
	params := paramFlags{}
	f.Func("param", "name=v1,v2,… (swept), name=v (fixed) or, with --trials, name=min:max, log:min:max or int:min:max (repeatable)", params.set)
	f.setUsage("deepseed sweep create --project P --param k=v1,v2 [flags] -- COMMAND...", "Queue one job per trial of a parameter sweep.", "")
	if err := f.parse(args); err != nil {
		return err
	}
	in := api.SweepCreate{Project: *project, Argv: f.fs.Args(), Params: params, Metric: *metric, Goal: *goal}
	var err error
	for name, p := range map[string]*string{"gpus": gpus, "retries": retries, "trials": trials} {
		n, err := strconv.Atoi(*p)
		if err != nil {
			return fmt.Errorf("sweep create: --%s %q is not a number", name, *p)
		}
		if name == "gpus" && n < 1 {
			return fmt.Errorf("sweep create: --gpus %q: want a whole number of GPUs, 1 or more", *p)
		}
		switch name {
		case "gpus":
			in.GPUs = n
		case "retries":
			in.Retries = n
		case "trials":
			in.Trials = n
		}
	}
	if *seed != "" {
		s, err := strconv.ParseInt(*seed, 10, 64)
		if err != nil {
			return fmt.Errorf("sweep create: --seed %q is not a number", *seed)
		}
		in.Seed = &s
	}
	if len(in.Argv) == 0 {
		return errors.New("sweep create: no command: put it after --, e.g. -- python train.py --lr {lr}")
	}
	var sw api.Sweep
	if err = a.call(ctx, http.MethodPost, "/api/v1/sweeps", in, &sw); err != nil {
		return fmt.Errorf("sweep create: %w", err)
	}
	if !*a.json {
		fmt.Printf("sweep %s: %d jobs queued (project %s)\n", sw.ID, len(sw.Trials), sw.Project)
	}
	return nil
}

func sweepShow(ctx context.Context, args []string) error {
	f := newEnvFlags("sweep show")
	a := addAPIFlags(f, readToken)
	metric := f.String("metric", "", "", "eval metric that ranks the trials, e.g. val_accuracy or val_loss (default: the sweep's)")
	goal := f.String("goal", "", "", "min or max (default: the sweep's, else min for a loss and max otherwise)")
	f.setUsage("deepseed sweep show [flags] ID", "Show a sweep's trials, best first by an eval metric.", "")
	if err := f.parse(args); err != nil {
		return err
	}
	if f.fs.NArg() != 1 {
		return errors.New("sweep show: give one sweep id, e.g. deepseed sweep show SWEEP_ID")
	}
	id := f.fs.Arg(0)
	q := url.Values{}
	if *metric != "" {
		q.Set("metric", *metric)
	}
	if *goal != "" {
		q.Set("goal", *goal)
	}
	var sw api.Sweep
	if err := a.call(ctx, http.MethodGet, "/api/v1/sweeps/"+url.PathEscape(id)+"?"+q.Encode(), nil, &sw); err != nil {
		return fmt.Errorf("sweep show: %w", err)
	}
	if *a.json {
		return nil
	}
	c := sw.Counts
	fmt.Printf("sweep %s (project %s): %d jobs, %d active, %d done, %d failed\n", sw.ID, sw.Project, c.Total, c.Active, c.Done, c.Failed)
	if sw.Metric != "" {
		fmt.Printf("ranked by %s, %s is best\n", sw.Metric, sw.Goal)
	}
	tb := newTable("RANK", "JOB", "STATE", "RUN", "FINAL", "BEST", "PARAMS")
	for _, t := range sw.Trials {
		rank := "-"
		if t.Rank > 0 {
			rank = strconv.Itoa(t.Rank)
		}
		tb.row(rank, t.Job.ID, t.Job.State, dash(t.Job.RunID), num(t.Final), num(t.Best), formatParams(t.Job.Params))
	}
	return tb.flush()
}

// gpuHours shows GPU-hours with two decimals, and an amount below 0.01
// with three significant digits: 0.000997 is not shown as 0.00 next to
// "exceeded".
func gpuHours(v float64) string {
	if v != 0 && math.Abs(v) < 0.01 {
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func num(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'g', 5, 64)
}

// QuotaCommand sets and shows GPU-hour quotas.
type QuotaCommand struct{}

const quotaUsage = `Usage: deepseed quota <set|show> [flags]

  deepseed quota set imdb --gpu-hours 30     (--gpu-hours none removes it)
  deepseed quota show [PROJECT]

Usage counts GPU-hours of a project's jobs (runtime x GPUs held) and, for
runs no job started, the GPU time the collector attributed to them. A project
at or over its quota gets no new job: submissions answer 409 and agents start
none of its queued jobs; running jobs are not stopped.`

// Run implements command.
func (c *QuotaCommand) Run(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		groupHelp(quotaUsage, submitToken)
		if len(args) == 0 {
			return errors.New("quota: name a subcommand: set or show")
		}
		return nil
	}
	sub := args[0]
	if sub != "set" && sub != "show" {
		return fmt.Errorf("quota: unknown subcommand %q (want set or show)", sub)
	}
	f := newEnvFlags("quota " + sub)
	k := readToken
	if sub == "set" {
		k = submitToken
	}
	a := addAPIFlags(f, k)
	hours := f.String("gpu-hours", "", "", "the project's limit in GPU-hours, or none to remove it")
	f.setUsage("deepseed quota "+sub+" [flags] [PROJECT]", "Set or show GPU-hour quotas.", "")
	if err := f.parse(args[1:]); err != nil {
		return err
	}
	if f.fs.NArg() > 1 {
		return fmt.Errorf("quota %s: give one project, got %q", sub, f.fs.Args())
	}
	project := f.fs.Arg(0)
	if sub == "set" {
		if project == "" || *hours == "" {
			return errors.New("quota set: give a project and --gpu-hours, e.g. quota set imdb --gpu-hours 30")
		}
		var in api.QuotaSet
		if *hours != "none" {
			h, err := strconv.ParseFloat(*hours, 64)
			if err != nil {
				return fmt.Errorf("quota set: --gpu-hours %q is not a number", *hours)
			}
			in.GPUHours = &h
		}
		var q api.Quota
		if err := a.call(ctx, http.MethodPut, "/api/v1/quotas/"+url.PathEscape(project), in, &q); err != nil {
			return fmt.Errorf("quota set: %w", err)
		}
		if !*a.json {
			printQuotas([]api.Quota{q})
		}
		return nil
	}
	var qs []api.Quota
	if project != "" {
		var q api.Quota
		if err := a.call(ctx, http.MethodGet, "/api/v1/quotas/"+url.PathEscape(project), nil, &q); err != nil {
			return fmt.Errorf("quota show: %w", err)
		}
		qs = []api.Quota{q}
	} else {
		var l api.QuotaList
		if err := a.call(ctx, http.MethodGet, "/api/v1/quotas", nil, &l); err != nil {
			return fmt.Errorf("quota show: %w", err)
		}
		qs = l.Quotas
	}
	if !*a.json {
		printQuotas(qs)
	}
	return nil
}

func printQuotas(qs []api.Quota) {
	t := newTable("PROJECT", "USED GPU-H", "LIMIT", "JOBS", "OTHER RUNS (NOT COUNTED)", "STATE")
	for _, q := range qs {
		limit, state := "none", "ok"
		if q.GPUHours != nil {
			limit = strconv.FormatFloat(*q.GPUHours, 'g', -1, 64)
		}
		if q.Exceeded {
			state = "exceeded"
		}
		t.row(q.Project, gpuHours(q.UsedGPUHours), limit, gpuHours(q.JobGPUHours), gpuHours(q.RunGPUHours), state)
	}
	t.flush()
}
