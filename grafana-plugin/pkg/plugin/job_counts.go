package plugin

import (
	"context"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// jobCountsQuery is the job counters, from the counts of GET /jobs.
var jobCountsQuery = queryFunc(func(ctx context.Context, d *Datasource, r request) (data.Frames, error) {
	jobs, err := d.listJobs(ctx, r.Project, r.Sweep, r.State, 1)
	if err != nil {
		return nil, err
	}
	return data.Frames{jobCountsFrame(jobs.Counts)}, nil
})

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
