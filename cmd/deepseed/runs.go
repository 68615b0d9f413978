package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/deepseed/deepseed/api"
)

// RunsCommand lists runs, newest first (GET /api/v1/runs).
type RunsCommand struct{}

// Run implements command.
func (c *RunsCommand) Run(ctx context.Context, args []string) error {
	f := newEnvFlags("runs")
	a := addAPIFlags(f, readToken)
	project := f.String("project", "DEEPSEED_PROJECT", "", "only runs of this project")
	status := f.String("status", "", "", "only runs in this status: running, finished, failed, crashed …")
	sweep := f.String("sweep", "", "", "only runs of this sweep")
	tag := f.String("tag", "", "", "only runs with this tag")
	limit := f.String("limit", "", "50", "most runs listed, newest first (up to 1000)")
	f.setUsage("deepseed runs [flags]", "List runs, newest first, with the figures checked first: status, steps, loss, step time and MFU.",
		`"deepseed run show ID" shows one run with its stragglers and open alerts.`)
	if err := f.parse(args); err != nil {
		return err
	}
	if f.fs.NArg() > 0 {
		return fmt.Errorf("runs: unexpected argument %q (deepseed run show ID shows one run)", f.fs.Arg(0))
	}
	q := url.Values{}
	for k, v := range map[string]string{"project": *project, "status": *status, "sweep": *sweep, "tag": *tag, "limit": *limit} {
		if v != "" {
			q.Set(k, v)
		}
	}
	var l api.RunList
	if err := a.call(ctx, http.MethodGet, "/api/v1/runs?"+q.Encode(), nil, &l); err != nil {
		return fmt.Errorf("runs: %w", err)
	}
	if *a.json {
		return nil
	}
	fmt.Printf("%d runs (%d shown)\n", l.Total, len(l.Runs))
	t := newTable("RUN", "PROJECT", "NAME", "STATUS", "STEPS", "LOSS", "STEP MS", "MFU", "STARTED")
	behind, now := 0, time.Now()
	for _, r := range l.Runs {
		steps := strconv.FormatInt(r.Steps, 10)
		if r.RollupLag != nil {
			steps += "*"
			behind++
		}
		t.row(r.RunID, r.Project, dash(r.Name), r.ShownStatus(now), steps,
			fnum(r.FinalLoss), fnum(r.MeanStepMS), pct(r.MeanMFU), when(r.StartedAt))
	}
	if err := t.flush(); err != nil {
		return err
	}
	if behind > 0 {
		fmt.Printf("* %d of these runs are still being rolled up (just loaded, or the server is catching up): their figures count the steps rolled up so far; list again in a moment\n", behind)
	}
	return nil
}

// rollupNote says how far a run's figures are behind its records, for
// run show; "" when they are not.
func rollupNote(lag *api.RollupLag) string {
	if lag == nil {
		return ""
	}
	return fmt.Sprintf("behind by %d blocks of 100 steps (the oldest %.0f s): the figures above count the steps rolled up so far", lag.Blocks, float64(lag.BehindS))
}

// RunCommand shows one run (GET /api/v1/runs/{id} and /ranks).
type RunCommand struct{}

const runUsage = `Usage: deepseed run show [flags] ID

Show one run: status, steps, loss, step time, MFU, stragglers and open
alerts. "deepseed runs" lists the runs.`

// Run implements command.
func (c *RunCommand) Run(ctx context.Context, args []string) error {
	if len(args) == 0 || isHelpWord(args[0]) {
		groupHelp(runUsage, readToken)
		if len(args) == 0 {
			return errors.New("run: name a subcommand: show")
		}
		return nil
	}
	if args[0] != "show" {
		return fmt.Errorf("run: unknown subcommand %q (want show; deepseed runs lists the runs)", args[0])
	}
	f := newEnvFlags("run show")
	a := addAPIFlags(f, readToken)
	f.setUsage("deepseed run show [flags] ID", "Show one run with its stragglers and open alerts.", "")
	if err := f.parse(args[1:]); err != nil {
		return err
	}
	if f.fs.NArg() != 1 {
		return errors.New("run show: give one run id, e.g. deepseed run show RUN_ID (deepseed runs lists them)")
	}
	id := url.PathEscape(f.fs.Arg(0))
	var r api.RunDetail
	if err := a.call(ctx, http.MethodGet, "/api/v1/runs/"+id, nil, &r); err != nil {
		return fmt.Errorf("run show: %w", err)
	}
	if *a.json {
		return nil
	}
	// The stragglers are another query; a run without steps has none.
	var ranks api.RanksResponse
	quiet := a
	quiet.json = new(bool)
	stragglers := "-"
	if quiet.call(ctx, http.MethodGet, "/api/v1/runs/"+id+"/ranks", nil, &ranks) == nil {
		n, worst := 0, []string{}
		for _, rk := range ranks.Ranks {
			if rk.Straggler {
				n++
				worst = append(worst, strconv.Itoa(rk.Rank))
			}
		}
		stragglers = fmt.Sprintf("%d of %d ranks", n, len(ranks.Ranks))
		if n > 0 {
			stragglers += " (ranks " + strings.Join(worst, ", ") + ")"
		}
	}
	steps := strconv.FormatInt(r.Steps, 10)
	if r.TotalSteps != nil {
		steps += " of " + strconv.FormatInt(*r.TotalSteps, 10)
	}
	fields := [][2]string{
		{"run", r.RunID}, {"project", r.Project}, {"name", dash(r.Name)}, {"status", r.ShownStatus(time.Now())},
		{"model", dash(r.Model)}, {"started", when(r.StartedAt)}, {"ended", when(r.EndedAt)},
		{"steps", steps}, {"final loss", fnum(r.FinalLoss)}, {"mean step ms", fnum(r.MeanStepMS)},
		{"mean MFU", pct(r.MeanMFU)}, {"best val accuracy", fnum(r.BestValAccuracy)},
		{"stragglers", stragglers}, {"open alerts", strconv.FormatInt(r.OpenAlerts, 10)},
		{"wasted gpu-hours", gpuHours(float64(r.Wasted.Total))},
	}
	if note := rollupNote(r.RollupLag); note != "" {
		fields = append(fields, [2]string{"rolled up", note})
	}
	return printFields(fields)
}
