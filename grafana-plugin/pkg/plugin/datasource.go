// Package plugin is the backend of the DeepSeed Grafana data source. It
// stays thin: each query becomes one call to the DeepSeed query service,
// whose JSON answer becomes data frames with units and display names.
//
//  1. Grafana starts the backend with [NewDatasource] per data source.
//  2. QueryData runs each panel query ([ParseQuery] checks it).
//  3. CheckHealth backs "Save & test"; CallResource feeds template
//     variables.
package plugin

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
	"github.com/grafana/grafana-plugin-sdk-go/backend/instancemgmt"
	"github.com/grafana/grafana-plugin-sdk-go/backend/log"
	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/grafana-plugin/pkg/models"
)

// PluginID is the data source's id in plugin.json.
const PluginID = "deepseed-telemetry-datasource"

// These checks make the build fail, rather than Grafana at run time, when
// Datasource stops implementing a handler Grafana calls.
var (
	_ backend.QueryDataHandler      = (*Datasource)(nil)
	_ backend.CheckHealthHandler    = (*Datasource)(nil)
	_ backend.CallResourceHandler   = (*Datasource)(nil)
	_ instancemgmt.InstanceDisposer = (*Datasource)(nil)
)

// Datasource is one configured DeepSeed data source.
type Datasource struct {
	settings *models.PluginSettings
	client   *client
	logger   log.Logger
}

// NewDatasource creates a data source instance from its settings. Grafana
// calls it again whenever the settings change.
func NewDatasource(_ context.Context, s backend.DataSourceInstanceSettings) (instancemgmt.Instance, error) {
	settings, err := models.LoadPluginSettings(s)
	if err != nil {
		return nil, err
	}
	return &Datasource{
		settings: settings,
		client: &client{
			base:  settings.URL,
			token: settings.Secrets.Token,
			http:  &http.Client{Timeout: settings.Timeout()},
		},
		logger: log.DefaultLogger.With("datasource", s.Name, "url", settings.URL),
	}, nil
}

// Dispose releases the instance's idle connections when Grafana replaces
// it after a settings change.
func (d *Datasource) Dispose() { d.client.http.CloseIdleConnections() }

// QueryData runs each query and answers one response per RefID; a query
// that fails gets an error response of its own, the others still run.
func (d *Datasource) QueryData(ctx context.Context, req *backend.QueryDataRequest) (*backend.QueryDataResponse, error) {
	resp := backend.NewQueryDataResponse()
	for _, q := range req.Queries {
		resp.Responses[q.RefID] = d.query(ctx, q)
	}
	return resp, nil
}

func (d *Datasource) query(ctx context.Context, dq backend.DataQuery) backend.DataResponse {
	q, err := ParseQuery(dq.JSON)
	if err != nil {
		return backend.ErrDataResponse(backend.StatusBadRequest, err.Error())
	}
	frames, err := d.run(ctx, q, dq)
	if err != nil {
		return errorResponse(err)
	}
	for _, f := range frames {
		f.RefID = dq.RefID
	}
	return backend.DataResponse{Frames: frames}
}

// errorResponse maps a failed call to the status Grafana shows: the
// server's 4xx stay the user's problem (bad parameter, unknown run),
// everything else is the server's.
func errorResponse(err error) backend.DataResponse {
	status := httpStatus(err)
	switch {
	case status == http.StatusBadRequest:
		return backend.ErrDataResponseWithSource(backend.StatusBadRequest, backend.ErrorSourceDownstream, err.Error())
	case status == http.StatusNotFound:
		return backend.ErrDataResponseWithSource(backend.StatusNotFound, backend.ErrorSourceDownstream, err.Error())
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return backend.ErrDataResponseWithSource(backend.StatusUnauthorized, backend.ErrorSourceDownstream,
			err.Error()+": check the data source's token")
	case errors.Is(err, context.DeadlineExceeded):
		return backend.ErrDataResponseWithSource(backend.StatusTimeout, backend.ErrorSourceDownstream, err.Error())
	case status == 0:
		return backend.ErrDataResponseWithSource(backend.StatusBadGateway, backend.ErrorSourceDownstream, err.Error())
	}
	return backend.ErrDataResponseWithSource(backend.StatusInternal, backend.ErrorSourceDownstream, err.Error())
}

// run calls the query service for one query and converts its answer.
func (d *Datasource) run(ctx context.Context, q api.PluginQuery, dq backend.DataQuery) (data.Frames, error) {
	p := url.Values{}
	set := func(k, v string) {
		if v != "" {
			p.Set(k, v)
		}
	}
	timeRange := func() {
		if !dq.TimeRange.From.IsZero() {
			p.Set("from", dq.TimeRange.From.UTC().Format(time.RFC3339Nano))
		}
		if !dq.TimeRange.To.IsZero() {
			p.Set("to", dq.TimeRange.To.UTC().Format(time.RFC3339Nano))
		}
	}
	maxPoints := func() {
		if n := min(dq.MaxDataPoints, maxPointsLimit); n > 0 {
			p.Set("max_points", strconv.FormatInt(n, 10))
		}
	}
	// Heatmaps and breakdowns are of one rank; "all" only means something
	// to series, so elsewhere it falls back to the server's default rank.
	oneRank := func() {
		if q.Rank != "all" {
			set("rank", q.Rank)
		}
	}
	steps := func() {
		if q.FromStep != nil {
			p.Set("from_step", strconv.FormatInt(*q.FromStep, 10))
		}
		if q.ToStep != nil {
			p.Set("to_step", strconv.FormatInt(*q.ToStep, 10))
		}
	}

	switch q.QueryType {
	case api.QueryRuns:
		set("project", q.Project)
		set("sweep", q.Sweep)
		set("tag", q.Tag)
		set("status", q.Status)
		runs, err := d.listRuns(ctx, p)
		if err != nil {
			return nil, err
		}
		return data.Frames{runsFrame("runs", runs)}, nil

	case api.QueryRunSummary, api.QueryRunDetails:
		var r api.RunDetail
		if err := d.client.get(ctx, runPath(q.RunID, ""), nil, &r); err != nil {
			return nil, err
		}
		if q.QueryType == api.QueryRunDetails {
			return data.Frames{runDetailsFrame(r)}, nil
		}
		if q.Format == FormatNumeric {
			return data.Frames{summaryNumericFrame(r.RunSummary)}, nil
		}
		return data.Frames{runsFrame("run_summary", []api.RunSummary{r.RunSummary})}, nil

	case api.QueryRunCode:
		var r api.RunCodeResponse
		if err := d.client.get(ctx, runPath(q.RunID, "code"), nil, &r); err != nil {
			return nil, err
		}
		return data.Frames{runCodeFrame(r)}, nil

	case api.QuerySeries:
		for _, m := range q.Metrics {
			p.Add("metric", m)
		}
		set("rank", q.Rank)
		steps()
		maxPoints()
		// On the step axis the whole run is wanted whatever the dashboard's
		// time picker says; on the time axis the picker rules.
		if q.XAxis != "step" {
			timeRange()
		}
		var r api.SeriesResponse
		if err := d.client.get(ctx, runPath(q.RunID, "series"), p, &r); err != nil {
			return nil, err
		}
		return seriesFrames(q, r, d.flaggedRanks(ctx, q)), nil

	case api.QueryHeatmap:
		set("pass", q.Pass)
		oneRank()
		switch {
		case q.MaxSteps > 0:
			p.Set("max_steps", strconv.Itoa(min(q.MaxSteps, maxPointsLimit)))
		case dq.MaxDataPoints > 0:
			p.Set("max_steps", strconv.FormatInt(min(dq.MaxDataPoints, maxPointsLimit), 10))
		}
		steps()
		var r api.Heatmap
		if err := d.client.get(ctx, runPath(q.RunID, "heatmap"), p, &r); err != nil {
			return nil, err
		}
		return data.Frames{heatmapFrame(q, r)}, nil

	case api.QueryEvals:
		var r api.EvalsResponse
		if err := d.client.get(ctx, runPath(q.RunID, "evals"), nil, &r); err != nil {
			return nil, err
		}
		return evalsFrames(q, r), nil

	case api.QueryBreakdown:
		oneRank()
		// A breakdown runs from a step to the run's end: GET breakdown
		// takes no to_step.
		if q.FromStep != nil {
			p.Set("from_step", strconv.FormatInt(*q.FromStep, 10))
		}
		var r api.Breakdown
		if err := d.client.get(ctx, runPath(q.RunID, "breakdown"), p, &r); err != nil {
			return nil, err
		}
		return data.Frames{breakdownFrame(r)}, nil

	case api.QueryMemory:
		var r api.MemoryResponse
		if err := d.client.get(ctx, runPath(q.RunID, "memory"), nil, &r); err != nil {
			return nil, err
		}
		return data.Frames{memoryFrame(r)}, nil

	case api.QueryRanks:
		if q.StragglerPct > 0 {
			p.Set("straggler_pct", strconv.FormatFloat(q.StragglerPct, 'g', -1, 64))
		}
		var r api.RanksResponse
		if err := d.client.get(ctx, runPath(q.RunID, "ranks"), p, &r); err != nil {
			return nil, err
		}
		switch {
		case q.Format == FormatNumeric:
			return data.Frames{ranksNumericFrame(q.RunID, r)}, nil
		case q.Part == api.PartHosts:
			return data.Frames{hostsFrame(r)}, nil
		}
		return data.Frames{ranksFrame(r)}, nil

	case api.QueryCompare:
		for _, id := range compareRuns(q) {
			p.Add("run", id)
		}
		set("sweep", q.Sweep)
		if len(p["run"]) == 0 && q.Sweep == "" {
			set("project", q.Project)
		}
		set("baseline", q.Baseline)
		var r api.CompareResponse
		if err := d.client.get(ctx, "/api/v1/compare", p, &r); err != nil {
			return nil, err
		}
		return data.Frames{compareFrame(r)}, nil

	case api.QueryGPUs:
		set("host", q.Host)
		// "*" is the Run picker's "All": every GPU, whoever held it.
		if q.RunID != AllRuns {
			set("run_id", q.RunID)
			// A rank number picks that rank's GPU; "all" or none, every
			// GPU of the run.
			if _, err := strconv.Atoi(q.Rank); err == nil && q.RunID != "" {
				set("rank", q.Rank)
			}
		}
		for _, m := range q.Metrics {
			p.Add("metric", m)
		}
		timeRange()
		maxPoints()
		var r api.GPUResponse
		if err := d.client.get(ctx, "/api/v1/gpus", p, &r); err != nil {
			return nil, err
		}
		if q.GPU != "" {
			// The service filters by host and run; one GPU of a host is
			// picked here.
			keep := r.Series[:0]
			for _, s := range r.Series {
				if strconv.Itoa(s.GPU) == q.GPU {
					keep = append(keep, s)
				}
			}
			r.Series = keep
		}
		if q.Format == FormatTable {
			return data.Frames{gpuTableFrame(r)}, nil
		}
		if len(r.Spread) > 0 {
			// A run of many GPUs: their distribution, drawn as the
			// ranks' band is.
			spread := spreadFrames(api.PluginQuery{XAxis: "time"}, api.SeriesResponse{Spread: r.Spread})
			return withNotice(spread, "gpus", r.Notice), nil
		}
		return gpuFrames(r), nil

	case api.QueryAnnotations:
		set("run_id", q.RunID)
		// One annotation per event type (checkpoints, overflow skips, …)
		// lets a dashboard give each its own colour and toggle.
		for _, t := range splitList(q.EventTypes) {
			p.Add("type", t)
		}
		// A run's events are wanted whole: its panels show the run's own
		// window (see window.go), which the dashboard's range may not cover.
		if q.RunID == "" {
			timeRange()
		}
		var r api.AnnotationsResponse
		if err := d.client.get(ctx, "/api/v1/annotations", p, &r); err != nil {
			return nil, err
		}
		return data.Frames{annotationsFrame(r)}, nil

	case api.QueryHangReports:
		// The run's reports whole, whatever the dashboard's range.
		set("run_id", q.RunID)
		for _, t := range HangEventTypes {
			p.Add("type", t)
		}
		var r api.AnnotationsResponse
		if err := d.client.get(ctx, "/api/v1/annotations", p, &r); err != nil {
			return nil, err
		}
		return data.Frames{hangFrame(r)}, nil

	case api.QueryAlerts:
		// Open alerts only: a rule fires while one is open and resolves
		// when the server resolves it.
		p.Set("state", "open")
		p.Set("limit", "1000")
		set("project", q.Project)
		set("run_id", q.RunID)
		set("kind", q.AlertKind)
		var r api.AlertList
		if err := d.client.get(ctx, "/api/v1/alerts", p, &r); err != nil {
			return nil, err
		}
		if q.Format == FormatNumeric {
			return data.Frames{alertsNumericFrame(r)}, nil
		}
		return data.Frames{alertsFrame(r)}, nil

	case api.QueryJobs, api.QueryJobCounts, api.QueryQuotas, api.QuerySweepTrials:
		return d.runJobs(ctx, q, time.Now())
	}
	return nil, &QueryError{Field: "queryType", Msg: "unknown " + q.QueryType}
}

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

// AllRuns is the value of a run picker's "All" on the GPU nodes
// dashboard: no filter by run.
const AllRuns = "*"

// maxPointsLimit is the most points the query service gives one series.
const maxPointsLimit = 10000
