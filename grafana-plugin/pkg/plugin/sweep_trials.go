package plugin

import (
	"cmp"
	"context"
	"maps"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// sweepTrialsQuery is a sweep's trials, from GET /sweeps/{id}: the query's
// sweep, else the newest of its project.
var sweepTrialsQuery = queryFunc(func(ctx context.Context, d *Datasource, r request) (data.Frames, error) {
	id, err := d.sweepOrNewest(ctx, r.Sweep, r.Project)
	if err != nil {
		return nil, err
	}
	if id == "" {
		f := data.NewFrame("sweep_trials")
		f.Meta = &data.FrameMeta{Notices: []data.Notice{{Severity: data.NoticeSeverityInfo, Text: "no sweep yet: create one with deepseed sweep create"}}}
		return data.Frames{f}, nil
	}
	sw, err := d.getSweep(ctx, id, r.Metric, r.Goal)
	if err != nil {
		return nil, err
	}
	return data.Frames{sweepTrialsFrame(sw, r.now)}, nil
})

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
// that has it has a number, so the column sorts as numbers; in
// scientific notation where one is very small or very large.
func paramField(rows []api.Trial, name string) *data.Field {
	numeric, unit := true, "none"
	for _, t := range rows {
		if v, ok := t.Job.Params[name]; ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				numeric = false
				break
			}
			// Learning rates read 5.00e-5, not a cut 0.0000500.
			if a := math.Abs(f); a != 0 && (a < 1e-3 || a >= 1e6) {
				unit = "sci"
			}
		}
	}
	if numeric {
		return numCol(rows, "param."+name, unit, name, func(t api.Trial) *float64 {
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
