package plugin

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// queryTypes has each query type of [api.PluginQueryTypes]; its answer is
// defined in the file named after it, its parameters beside its frames.
var queryTypes = map[string]queryType{
	api.QueryRuns:        {needsRun: false, answer: runsQuery},
	api.QueryRunSummary:  {needsRun: true, answer: runSummaryQuery},
	api.QueryRunDetails:  {needsRun: true, answer: runDetailsQuery},
	api.QueryRunCode:     {needsRun: true, answer: runCodeQuery},
	api.QuerySeries:      {needsRun: true, answer: seriesQuery},
	api.QueryHeatmap:     {needsRun: true, answer: heatmapQuery},
	api.QueryEvals:       {needsRun: true, answer: evalsQuery},
	api.QueryBreakdown:   {needsRun: true, answer: breakdownQuery},
	api.QueryMemory:      {needsRun: true, answer: memoryQuery},
	api.QueryRanks:       {needsRun: true, answer: ranksQuery},
	api.QueryCompare:     {needsRun: false, answer: compareQuery},
	api.QueryGPUs:        {needsRun: false, answer: gpusQuery},
	api.QueryAnnotations: {needsRun: false, answer: annotationsQuery},
	api.QueryHangReports: {needsRun: true, answer: hangReportsQuery},
	api.QueryConsistency: {needsRun: true, answer: consistencyQuery},
	api.QueryRegression:  {needsRun: true, answer: regressionQuery},
	api.QueryLedger:      {needsRun: false, answer: ledgerQuery},
	api.QueryAlerts:      {needsRun: false, answer: alertsQuery},
	api.QueryJobs:        {needsRun: false, answer: jobsQuery},
	api.QueryJobCounts:   {needsRun: false, answer: jobCountsQuery},
	api.QueryQuotas:      {needsRun: false, answer: quotasQuery},
	api.QuerySweepTrials: {needsRun: false, answer: sweepTrialsQuery},
}

// queryType is one type of query.
type queryType struct {
	needsRun bool     // ParseQuery refuses a query of the type without a runId
	answer   answerer // calls the query service, builds the frames
}

// An answerer answers one type of query: it calls the query service and
// turns the answer into frames.
type answerer interface {
	run(ctx context.Context, d *Datasource, r request) (data.Frames, error)
}

// request is a checked query with what Grafana sends beside it.
type request struct {
	api.PluginQuery
	timeRange     backend.TimeRange // the dashboard's time picker
	maxDataPoints int64             // the panel's width in points
	now           time.Time
}

// get answers a query type of one GET: its path and parameters come from
// the request, its frames from the answer, decoded into an A.
type get[A any] struct {
	path   func(r request) string
	params func(r request) params // nil: none
	frames func(r request, answer A) data.Frames
}

func (t get[A]) run(ctx context.Context, d *Datasource, r request) (data.Frames, error) {
	var p params
	if t.params != nil {
		p = t.params(r)
	}
	var answer A
	if err := d.client.get(ctx, t.path(r), url.Values(p), &answer); err != nil {
		return nil, err
	}
	return t.frames(r, answer), nil
}

// queryFunc answers a query type of more than one call, or of calls that
// depend on an answer.
type queryFunc func(ctx context.Context, d *Datasource, r request) (data.Frames, error)

func (f queryFunc) run(ctx context.Context, d *Datasource, r request) (data.Frames, error) {
	return f(ctx, d, r)
}

// params are the query parameters of one call.
type params url.Values

// set sets k to v unless v is empty: the server's default applies.
func (p params) set(k, v string) {
	if v != "" {
		url.Values(p).Set(k, v)
	}
}

// add adds each of vs as a value of k.
func (p params) add(k string, vs []string) {
	for _, v := range vs {
		url.Values(p).Add(k, v)
	}
}

// step sets k to a step number, if there is one.
func (p params) step(k string, v *int64) {
	if v != nil {
		p.set(k, strconv.FormatInt(*v, 10))
	}
}

// timeRange sets from and to to the dashboard's time range.
func (p params) timeRange(tr backend.TimeRange) {
	if !tr.From.IsZero() {
		p.set("from", tr.From.UTC().Format(time.RFC3339Nano))
	}
	if !tr.To.IsZero() {
		p.set("to", tr.To.UTC().Format(time.RFC3339Nano))
	}
}

// maxPoints sets max_points to the panel's width, within the server's
// limit.
func (p params) maxPoints(n int64) {
	if n = min(n, maxPointsLimit); n > 0 {
		p.set("max_points", strconv.FormatInt(n, 10))
	}
}

// oneRank sets the rank of a heatmap or breakdown, which are of one rank;
// "all" only means something to series, so here it falls back to the
// server's default rank.
func (p params) oneRank(rank string) {
	if rank != "all" {
		p.set("rank", rank)
	}
}

// maxPointsLimit is the most points the query service gives one series.
const maxPointsLimit = 10000

// splitList flattens list values that a multi-value variable may have
// turned into one "{a,b}" or "a,b" string.
func splitList(vs []string) []string {
	var out []string
	for _, v := range vs {
		v = strings.TrimSuffix(strings.TrimPrefix(v, "{"), "}")
		for _, part := range strings.Split(v, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out = append(out, part)
			}
		}
	}
	return out
}

// runPathOf is the path of a run's sub-resource: /runs/{id}/sub, or the
// run itself for "".
func runPathOf(sub string) func(request) string {
	return func(r request) string { return runPath(r.RunID, sub) }
}

// pathOf is a fixed path.
func pathOf(path string) func(request) string {
	return func(request) string { return path }
}
