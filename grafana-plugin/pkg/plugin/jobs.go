package plugin

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// This file serves the jobs dashboard: the job table, its counters, the
// GPU quotas and a sweep's trials, each one call to the server's job
// routes (which read tokens may read).

// JobStates are the states of a job, in the order a job goes through them.
var JobStates = []string{"queued", "running", "finished", "failed", "cancelled", "lost"}

// maxJobs is the most jobs the server lists at once.
const maxJobs = 1000

// GPUHoursUnit is the unit of GPU-hour figures.
const GPUHoursUnit = "suffix: GPU-h"

// filterValue is a picker's value as a filter: "" for none or All.
func filterValue(v string) string {
	if v == api.AllValue {
		return ""
	}
	return v
}

// listJobs asks GET /jobs with the query's project, sweep and state.
func (d *Datasource) listJobs(ctx context.Context, project, sweep, state string, limit int) (api.JobList, error) {
	p := url.Values{"limit": {strconv.Itoa(limit)}}
	for k, v := range map[string]string{"project": project, "sweep": sweep, "state": state} {
		if v = filterValue(v); v != "" {
			p.Set(k, v)
		}
	}
	var r api.JobList
	err := d.client.get(ctx, "/api/v1/jobs", p, &r)
	return r, err
}

// runJobs answers the job query types.
func (d *Datasource) runJobs(ctx context.Context, q api.PluginQuery, now time.Time) (data.Frames, error) {
	switch q.QueryType {
	case api.QueryJobs:
		r, err := d.listJobs(ctx, q.Project, q.Sweep, q.State, maxJobs)
		if err != nil {
			return nil, err
		}
		return data.Frames{jobsFrame(r, now)}, nil

	case api.QueryJobCounts:
		r, err := d.listJobs(ctx, q.Project, q.Sweep, q.State, 1)
		if err != nil {
			return nil, err
		}
		return data.Frames{jobCountsFrame(r.Counts)}, nil

	case api.QueryQuotas:
		var list []api.Quota
		if p := filterValue(q.Project); p != "" {
			var one api.Quota
			if err := d.client.get(ctx, "/api/v1/quotas/"+url.PathEscape(p), nil, &one); err != nil {
				return nil, err
			}
			list = []api.Quota{one}
		} else {
			var r api.QuotaList
			if err := d.client.get(ctx, "/api/v1/quotas", nil, &r); err != nil {
				return nil, err
			}
			list = r.Quotas
		}
		return data.Frames{quotasFrame(list)}, nil

	case api.QuerySweepTrials:
		id, err := d.sweepOrNewest(ctx, q.Sweep, q.Project)
		if err != nil {
			return nil, err
		}
		if id == "" {
			f := data.NewFrame("sweep_trials")
			f.Meta = &data.FrameMeta{Notices: []data.Notice{{Severity: data.NoticeSeverityInfo, Text: "no sweep yet: create one with deepseed sweep create"}}}
			return data.Frames{f}, nil
		}
		sw, err := d.getSweep(ctx, id, q.Metric, q.Goal)
		if err != nil {
			return nil, err
		}
		return data.Frames{sweepTrialsFrame(sw, now)}, nil
	}
	return nil, &QueryError{Field: "queryType", Msg: "unknown " + q.QueryType}
}

// sweepOrNewest is sweep, or for none or All the newest sweep of project
// (of any project for none or All): the trials panel shows the latest
// sweep until one is picked. "" when there is no sweep at all.
func (d *Datasource) sweepOrNewest(ctx context.Context, sweep, project string) (string, error) {
	if s := filterValue(sweep); s != "" {
		return s, nil
	}
	sweeps, err := d.jobSweeps(ctx, project)
	if err != nil || len(sweeps) == 0 {
		return "", err
	}
	return sweeps[0], nil
}

// jobSweeps lists the sweep ids of the newest jobs of project, newest
// sweep first.
func (d *Datasource) jobSweeps(ctx context.Context, project string) ([]string, error) {
	r, err := d.listJobs(ctx, project, "", "", maxJobs)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, j := range r.Jobs {
		if j.SweepID != "" && !slices.Contains(out, j.SweepID) {
			out = append(out, j.SweepID)
		}
	}
	return out, nil
}

func (d *Datasource) getSweep(ctx context.Context, id, metric, goal string) (api.Sweep, error) {
	p := url.Values{}
	if metric = filterValue(metric); metric != "" {
		p.Set("metric", metric)
	}
	if goal = filterValue(goal); goal != "" {
		p.Set("goal", goal)
	}
	var sw api.Sweep
	err := d.client.get(ctx, "/api/v1/sweeps/"+url.PathEscape(id), p, &sw)
	return sw, err
}

// jobWindow is the window of a job's run, as the window resource gives a
// run's (with the same margin), from the job's start and end: the
// Training run dashboard opens on it. nil before the job starts.
func jobWindow(j api.Job, now time.Time) *runWindow {
	if j.StartedAt == nil {
		return nil
	}
	status := "running"
	if j.EndedAt != nil {
		status = j.State
	}
	w, err := windowOf(api.RunSummary{StartedAt: j.StartedAt, EndedAt: j.EndedAt, Status: status}, now)
	if err != nil {
		return nil
	}
	return &w
}

func windowMS(w *runWindow, to bool) *int64 {
	if w == nil {
		return nil
	}
	t := w.from
	if to {
		t = w.to
	}
	return i64(t.UnixMilli())
}

// paramsText writes a job's parameters as "k=v k=v", sorted by name.
func paramsText(p map[string]string) string {
	parts := make([]string, 0, len(p))
	for _, k := range slices.Sorted(maps.Keys(p)) {
		parts = append(parts, k+"="+p[k])
	}
	return strings.Join(parts, " ")
}

// jobColumns are the columns of a job that the jobs table and the sweep
// trials share, after their own first columns.
func jobColumns[T any](rows []T, job func(T) api.Job, now time.Time) []*data.Field {
	win := func(r T) *runWindow { return jobWindow(job(r), now) }
	return []*data.Field{
		strCol(rows, "state", "State", func(r T) string { return job(r).State }),
		numCol(rows, "runtime_s", "s", "Runtime", func(r T) *float64 { v := job(r).RuntimeSeconds; return &v }),
		intCol(rows, "gpus", "GPUs", func(r T) *int64 { return i64(int64(job(r).GPUs)) }),
		numCol(rows, "gpu_hours", GPUHoursUnit, "GPU-hours", func(r T) *float64 { v := job(r).GPUHours; return &v }),
		strCol(rows, "agent", "Agent", func(r T) string { return job(r).Agent }),
		strCol(rows, "external_id", "Slurm job / pid", func(r T) string { return job(r).ExternalID }),
		intCol(rows, "exit_code", "Exit code", func(r T) *int64 { return ip(job(r).ExitCode) }),
		strCol(rows, "run_id", "Run", func(r T) string { return job(r).RunID }),
		timeCol(rows, "created_at", "Submitted", func(r T) *time.Time { t := job(r).CreatedAt; return &t }),
		timeCol(rows, "started_at", "Started", func(r T) *time.Time { return job(r).StartedAt }),
		timeCol(rows, "ended_at", "Ended", func(r T) *time.Time { return job(r).EndedAt }),
		// The run's window in epoch ms, for the Run column's link.
		intCol(rows, "run_from", "Run from", func(r T) *int64 { return windowMS(win(r), false) }),
		intCol(rows, "run_to", "Run to", func(r T) *int64 { return windowMS(win(r), true) }),
	}
}

// jobsFrame is the job table, newest first: id, project, sweep,
// parameters, then the shared job columns and the detail. Its meta holds
// the counters of every job that matches, and the limit when the list is
// cut.
func jobsFrame(r api.JobList, now time.Time) *data.Frame {
	rows := r.Jobs
	id := func(j api.Job) api.Job { return j }
	fields := []*data.Field{
		intCol(rows, "id", "Job", func(j api.Job) *int64 { return i64(j.ID) }),
		strCol(rows, "project", "Project", func(j api.Job) string { return j.Project }),
		strCol(rows, "sweep_id", "Sweep", func(j api.Job) string { return j.SweepID }),
		strCol(rows, "params", "Params", func(j api.Job) string { return paramsText(j.Params) }),
	}
	fields = append(fields, jobColumns(rows, id, now)...)
	fields = append(fields,
		intCol(rows, "attempt", "Attempt", func(j api.Job) *int64 { return i64(int64(j.Attempt)) }),
		strCol(rows, "detail", "Detail", func(j api.Job) string { return j.Detail }),
	)
	f := data.NewFrame("jobs", fields...)
	f.Meta = &data.FrameMeta{Custom: map[string]any{"total": r.Counts.Total, "limit": r.Limit}}
	if r.Counts.Total > len(rows) {
		f.Meta.Notices = []data.Notice{{Severity: data.NoticeSeverityInfo,
			Text: fmt.Sprintf("the newest %d of %d jobs", len(rows), r.Counts.Total)}}
	}
	return f
}

// jobCountFields are the counters of [api.JobCounts], the seed's four
// first.
var jobCountFields = []struct {
	name, display string
	get           func(api.JobCounts) int
}{
	{"total", "Total", func(c api.JobCounts) int { return c.Total }},
	{"active", "Active", func(c api.JobCounts) int { return c.Active }},
	{"done", "Done", func(c api.JobCounts) int { return c.Done }},
	{"failed", "Failed", func(c api.JobCounts) int { return c.Failed }},
	{"queued", "Queued", func(c api.JobCounts) int { return c.Queued }},
	{"running", "Running", func(c api.JobCounts) int { return c.Running }},
	{"cancelled", "Cancelled", func(c api.JobCounts) int { return c.Cancelled }},
	{"lost", "Lost", func(c api.JobCounts) int { return c.Lost }},
}

// jobCountsFrame is the counters as one numeric-wide row, for stat panels
// and alert rules: active is queued plus running, done is finished,
// failed is failed plus lost.
func jobCountsFrame(c api.JobCounts) *data.Frame {
	fields := make([]*data.Field, 0, len(jobCountFields))
	for _, fc := range jobCountFields {
		v := float64(fc.get(c))
		fields = append(fields, numericField(fc.name, "none", nil, &v).
			SetConfig(&data.FieldConfig{Unit: "none", DisplayNameFromDS: fc.display}))
	}
	return numericFrame("job_counts", fields)
}

// quotasFrame is one number field per project, the GPU-hours it has used,
// labelled project and limit, with its limit as the field's max (and in
// its display name): a bar gauge draws each project's used / limit. A
// project without a limit has no max.
func quotasFrame(qs []api.Quota) *data.Frame {
	fields := make([]*data.Field, 0, len(qs))
	for _, q := range qs {
		used := q.UsedGPUHours
		cfg := &data.FieldConfig{Unit: GPUHoursUnit, Min: ptrConfig(0)}
		limit := "no limit"
		if q.GPUHours != nil {
			cfg.Max = ptrConfig(*q.GPUHours)
			limit = fmt.Sprintf("limit %s GPU-h", strconv.FormatFloat(*q.GPUHours, 'g', -1, 64))
		}
		cfg.DisplayNameFromDS = fmt.Sprintf("%s (%s)", q.Project, limit)
		// The limit is a label too: a bar gauge of one project hides a
		// name from the data source, and its panel names the bar from
		// the labels instead.
		labels := data.Labels{"project": q.Project, "limit": limit}
		fields = append(fields, numericField("used_gpu_hours", GPUHoursUnit, labels, &used).SetConfig(cfg))
	}
	f := numericFrame("quotas", fields)
	limits := map[string]any{}
	for _, q := range qs {
		limits[q.Project] = q.GPUHours
	}
	f.Meta.Custom = map[string]any{"limits": limits}
	return f
}

func ptrConfig(v float64) *data.ConfFloat64 { c := data.ConfFloat64(v); return &c }

// metricUnitOf is the unit of an eval metric by its name: accuracy and F1
// are fractions, anything else has none.
func metricUnitOf(metric string) string {
	if strings.HasSuffix(metric, "accuracy") || strings.HasSuffix(metric, "_f1") || metric == "f1" {
		return "percentunit"
	}
	return "none"
}

// sweepTrialsFrame is a sweep's trials, best first as the server ranks
// them: rank, job, each parameter as its own column (a number where every
// trial's value is one), the metric's final and best value, then the
// shared job columns.
func sweepTrialsFrame(sw api.Sweep, now time.Time) *data.Frame {
	rows := sw.Trials
	names := map[string]bool{}
	for _, t := range rows {
		for k := range t.Job.Params {
			names[k] = true
		}
	}
	fields := []*data.Field{
		intCol(rows, "rank", "Rank", func(t api.Trial) *int64 {
			if t.Rank == 0 {
				return nil
			}
			return i64(int64(t.Rank))
		}),
		intCol(rows, "id", "Job", func(t api.Trial) *int64 { return i64(t.Job.ID) }),
	}
	for _, k := range slices.Sorted(maps.Keys(names)) {
		fields = append(fields, paramField(rows, k))
	}
	unit, metric := metricUnitOf(sw.Metric), cmp.Or(sw.Metric, "metric")
	fields = append(fields,
		numCol(rows, "final", unit, "Final "+metric, func(t api.Trial) *float64 { return t.Final }),
		numCol(rows, "best", unit, "Best "+metric, func(t api.Trial) *float64 { return t.Best }),
	)
	fields = append(fields, jobColumns(rows, func(t api.Trial) api.Job { return t.Job }, now)...)
	f := data.NewFrame("sweep_trials", fields...)
	f.Meta = &data.FrameMeta{Custom: map[string]any{"sweep": sw.ID, "project": sw.Project, "metric": sw.Metric, "goal": sw.Goal}}
	if sw.Metric == "" {
		f.Meta.Notices = []data.Notice{{Severity: data.NoticeSeverityInfo,
			Text: "the sweep names no metric: pick one to rank its trials"}}
	}
	return f
}

// paramField is one parameter of the trials, numbers when every trial
// that has it has a number, so the column sorts as numbers.
func paramField(rows []api.Trial, name string) *data.Field {
	numeric := true
	for _, t := range rows {
		if v, ok := t.Job.Params[name]; ok {
			if _, err := strconv.ParseFloat(v, 64); err != nil {
				numeric = false
				break
			}
		}
	}
	if numeric {
		return numCol(rows, "param."+name, "none", name, func(t api.Trial) *float64 {
			v, ok := t.Job.Params[name]
			if !ok {
				return nil
			}
			f, _ := strconv.ParseFloat(v, 64)
			return &f
		})
	}
	return strCol(rows, "param."+name, name, func(t api.Trial) string { return t.Job.Params[name] })
}

// jobResource serves the job variables' lists.
func (d *Datasource) jobResource(ctx context.Context, path string, q url.Values) ([]Option, error) {
	switch path {
	case api.VariableJobProjects:
		r, err := d.listJobs(ctx, "", "", "", maxJobs)
		if err != nil {
			return nil, err
		}
		var qs api.QuotaList
		if err := d.client.get(ctx, "/api/v1/quotas", nil, &qs); err != nil {
			return nil, err
		}
		var names []string
		for _, j := range r.Jobs {
			if !slices.Contains(names, j.Project) {
				names = append(names, j.Project)
			}
		}
		for _, q := range qs.Quotas {
			if !slices.Contains(names, q.Project) {
				names = append(names, q.Project)
			}
		}
		slices.Sort(names)
		return textOptions(names), nil

	case api.VariableJobSweeps:
		sweeps, err := d.jobSweeps(ctx, q.Get("project"))
		if err != nil {
			return nil, err
		}
		return textOptions(sweeps), nil

	case api.VariableJobStates:
		return textOptions(JobStates), nil

	case api.VariableSweepMetrics:
		return d.sweepMetrics(ctx, q.Get("sweep"), q.Get("project"))

	case api.VariableSweepGoals:
		return d.sweepGoals(ctx, q.Get("sweep"), q.Get("project"), q.Get("metric"))
	}
	return nil, &QueryError{Msg: fmt.Sprintf("unknown resource %q; want one of %s", path, strings.Join(api.VariableResources, ", "))}
}

// metricRuns bounds how many of a sweep's runs the metric list reads.
const metricRuns = 5

// sweepMetrics lists the metrics a sweep's trials can be ranked by: the
// sweep's own, then those of its runs' evaluations as sweep show names
// them (<split>_loss, <split>_accuracy, <split>_f1, <split>_<metric>).
func (d *Datasource) sweepMetrics(ctx context.Context, sweep, project string) ([]Option, error) {
	id, err := d.sweepOrNewest(ctx, sweep, project)
	if err != nil || id == "" {
		return []Option{}, err
	}
	sw, err := d.getSweep(ctx, id, "", "")
	if err != nil {
		return nil, err
	}
	var names []string
	if sw.Metric != "" {
		names = append(names, sw.Metric)
	}
	read := 0
	for _, t := range sw.Trials {
		if t.Job.RunID == "" || read == metricRuns {
			continue
		}
		read++
		var r api.EvalsResponse
		if err := d.client.get(ctx, runPath(t.Job.RunID, "evals"), nil, &r); err != nil {
			return nil, err
		}
		var found []string
		for _, e := range r.Evals {
			add := func(name string, ok bool) {
				if ok && !slices.Contains(names, name) && !slices.Contains(found, name) {
					found = append(found, name)
				}
			}
			add(e.Split+"_loss", e.Loss != nil)
			add(e.Split+"_accuracy", e.Accuracy != nil)
			add(e.Split+"_f1", e.F1 != nil)
			for k := range e.Metrics {
				add(e.Split+"_"+k, true)
			}
		}
		slices.Sort(found)
		names = append(names, found...)
	}
	return textOptions(names), nil
}

// sweepGoals is max and min, the one that suits metric first: the
// sweep's own goal for its own metric, min for a loss, else max.
func (d *Datasource) sweepGoals(ctx context.Context, sweep, project, metric string) ([]Option, error) {
	metric = filterValue(metric)
	first := "max"
	if strings.HasSuffix(metric, "loss") {
		first = "min"
	}
	id, err := d.sweepOrNewest(ctx, sweep, project)
	if err != nil {
		return nil, err
	}
	if id != "" {
		sw, err := d.getSweep(ctx, id, "", "")
		if err != nil {
			return nil, err
		}
		if sw.Goal != "" && (metric == "" || metric == sw.Metric) {
			first = sw.Goal
		}
	}
	if first == "min" {
		return textOptions([]string{"min", "max"}), nil
	}
	return textOptions([]string{"max", "min"}), nil
}
