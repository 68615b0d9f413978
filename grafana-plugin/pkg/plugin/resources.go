package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"

	"github.com/deepseed/deepseed/api"
)

// Option is one choice of a template variable, in the shape of Grafana's
// MetricFindValue.
type Option struct {
	Text  string `json:"text"`
	Value string `json:"value"`
}

// CallResource serves the lists behind template variables, as GET
// resources of the data source:
//
//	projects                          distinct projects of all runs, that of the newest run first
//	runs?project=&sweep=&tag=&status= runs, newest first (text: name)
//	sweeps?project=                   distinct non-empty sweep ids of runs
//	metrics?run=                      series metrics, the run's own included
//	ranks?run=                        the ranks that reported
//	hosts?run=&from=&to=              hosts with GPU samples
//	window?run=&part=&to=             one part of a run's time window
//	job_projects                      distinct projects of jobs and quotas
//	job_sweeps?project=               sweep ids of jobs, newest first
//	job_states                        the states a job can be in
//	sweep_metrics?sweep=&project=     metrics to rank a sweep's trials by
//	sweep_goals?sweep=&project=&metric= max and min, the fitting one first
//
// These are the resources of [api.VariableQuery]; the frontend's variable
// support passes a variable query's filters as the query string.
func (d *Datasource) CallResource(ctx context.Context, req *backend.CallResourceRequest, sender backend.CallResourceResponseSender) error {
	if req.Method != "" && req.Method != http.MethodGet {
		return sendJSON(sender, http.StatusMethodNotAllowed, api.Error{Error: "only GET is served"})
	}
	u, err := url.Parse(req.URL)
	if err != nil {
		return sendJSON(sender, http.StatusBadRequest, api.Error{Error: "bad resource URL"})
	}
	path := strings.Trim(req.Path, "/")
	if path == "" {
		path = strings.Trim(u.Path, "/")
	}
	opts, err := d.resource(ctx, path, u.Query())
	if err != nil {
		status := httpStatus(err)
		switch {
		case status == 0:
			status = http.StatusBadGateway
			if _, ok := err.(*QueryError); ok {
				status = http.StatusNotFound
			}
		case status >= 500:
			status = http.StatusBadGateway
		}
		return sendJSON(sender, status, api.Error{Error: err.Error()})
	}
	return sendJSON(sender, http.StatusOK, opts)
}

func (d *Datasource) resource(ctx context.Context, path string, q url.Values) ([]Option, error) {
	switch path {
	case api.VariableProjects:
		runs, err := d.listRuns(ctx, nil)
		if err != nil {
			return nil, err
		}
		// The runs come newest first, so the project of the newest run
		// is first: what Grafana picks on load, beside the newest run
		// the Run variable picks.
		var names []string
		for _, r := range runs {
			if r.Project != "" && !slices.Contains(names, r.Project) {
				names = append(names, r.Project)
			}
		}
		return textOptions(names), nil

	case api.VariableRuns:
		filter := url.Values{}
		for _, k := range []string{"project", "sweep", "tag", "status"} {
			if v := q.Get(k); v != "" {
				filter.Set(k, v)
			}
		}
		runs, err := d.listRuns(ctx, filter)
		if err != nil {
			return nil, err
		}
		ids, names := make([]string, len(runs)), make([]string, len(runs))
		for i, r := range runs {
			ids[i], names[i] = r.RunID, r.Name
		}
		opts := make([]Option, 0, len(runs)+1)
		if q.Get("baseline") == "true" {
			opts = append(opts, Option{Text: api.BaselineOptionText, Value: api.BaselineFirst})
		}
		for i, text := range runLabels(ids, names) {
			opts = append(opts, Option{Text: text, Value: ids[i]})
		}
		return opts, nil

	case api.VariableSweeps:
		filter := url.Values{}
		if v := q.Get("project"); v != "" {
			filter.Set("project", v)
		}
		runs, err := d.listRuns(ctx, filter)
		if err != nil {
			return nil, err
		}
		// A sweep of one run has nothing to compare its run with.
		trials := map[string]int{}
		for _, r := range runs {
			if r.SweepID != "" {
				trials[r.SweepID]++
			}
		}
		var sweeps []string
		for s, n := range trials {
			if n > 1 {
				sweeps = append(sweeps, s)
			}
		}
		slices.Sort(sweeps)
		return textOptions(sweeps), nil

	case api.VariableMetrics:
		names := slices.Clone(stepMetrics)
		if run := q.Get("run"); run != "" {
			var r api.RunDetail
			if err := d.client.get(ctx, runPath(run, ""), nil, &r); err != nil {
				return nil, err
			}
			for _, m := range r.Metrics {
				if !strings.HasPrefix(m, "metrics.") {
					m = "metrics." + m
				}
				if !slices.Contains(names, m) {
					names = append(names, m)
				}
			}
		}
		return textOptions(names), nil

	case api.VariableRanks:
		run := q.Get("run")
		if run == "" {
			return nil, &QueryError{Field: "run", Msg: "ranks needs ?run="}
		}
		var r api.RunDetail
		if err := d.client.get(ctx, runPath(run, ""), nil, &r); err != nil {
			return nil, err
		}
		ranks := slices.Clone(r.Ranks)
		slices.Sort(ranks)
		opts := make([]Option, 0, len(ranks))
		for _, n := range ranks {
			opts = append(opts, Option{Text: strconv.Itoa(n), Value: strconv.Itoa(n)})
		}
		return opts, nil

	case api.VariableHosts:
		// per_gpu: every GPU's host, also of a run of more than
		// api.MaxRankSeries GPUs, whose charts get a distribution.
		p := url.Values{"max_points": {"1"}, "per_gpu": {"true"}}
		for k, to := range map[string]string{"run": "run_id", "run_id": "run_id", "from": "from", "to": "to"} {
			if v := q.Get(k); v != "" && v != api.AllValue {
				p.Set(to, v)
			}
		}
		var r api.GPUResponse
		if err := d.client.get(ctx, "/api/v1/gpus", p, &r); err != nil {
			return nil, err
		}
		var hosts []string
		for _, s := range r.Series {
			if s.Host != "" && !slices.Contains(hosts, s.Host) {
				hosts = append(hosts, s.Host)
			}
		}
		slices.Sort(hosts)
		return textOptions(hosts), nil

	case api.VariableWindow:
		return d.windowResource(ctx, q, time.Now())

	case api.VariableJobProjects, api.VariableJobSweeps, api.VariableJobStates, api.VariableSweepMetrics, api.VariableSweepGoals:
		return d.jobResource(ctx, path, q)
	}
	return nil, &QueryError{Msg: fmt.Sprintf("unknown resource %q; want one of %s", path, strings.Join(api.VariableResources, ", "))}
}

func textOptions(names []string) []Option {
	opts := make([]Option, len(names))
	for i, n := range names {
		opts[i] = Option{Text: n, Value: n}
	}
	return opts
}

func sendJSON(sender backend.CallResourceResponseSender, status int, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("resource: encode answer: %w", err)
	}
	return sender.Send(&backend.CallResourceResponse{
		Status:  status,
		Headers: map[string][]string{"Content-Type": {"application/json"}},
		Body:    b,
	})
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
