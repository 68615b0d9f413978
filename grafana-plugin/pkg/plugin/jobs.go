package plugin

import (
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

// The jobs dashboard's query types read the server's job routes, which
// read tokens may read: the job table (this file), its counters
// (job_counts.go), the GPU quotas (quotas.go) and a sweep's trials
// (sweep_trials.go).

// jobsQuery is the job table, from GET /jobs.
var jobsQuery = queryFunc(func(ctx context.Context, d *Datasource, r request) (data.Frames, error) {
	jobs, err := d.listJobs(ctx, r.Project, r.Sweep, r.State, maxJobs)
	if err != nil {
		return nil, err
	}
	return data.Frames{jobsFrame(jobs, r.now)}, nil
})

// JobStates are the states of a job, in the order a job goes through them.
var JobStates = []string{"queued", "running", "finished", "failed", "cancelled", "lost"}

// maxJobs is the most jobs the server lists at once.
const maxJobs = 1000

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
		numCol(rows, "gpu_hours", api.GPUHoursUnit, "GPU-hours", func(r T) *float64 { v := job(r).GPUHours; return &v }),
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
