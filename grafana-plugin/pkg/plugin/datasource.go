// Package plugin is the backend of the DeepSeed Grafana data source. It
// stays thin: each query becomes calls to the DeepSeed query service,
// whose JSON answers become data frames with units and display names.
//
//  1. Grafana starts the backend with [NewDatasource] per data source.
//  2. QueryData runs each panel query: [ParseQuery] checks it, and its
//     type's entry in the queryTypes table (querytypes.go) answers it.
//  3. CheckHealth (health.go) backs "Save & test"; CallResource
//     (resources.go) feeds template variables.
//
// Each query type has a file named after it (runs.go, series.go,
// heatmap.go, sweep_trials.go, …) that holds the parameters of its call
// and the frames it builds from the answer. A type of one GET is a get
// value (path, parameters, frames); a type of several calls is a
// queryFunc. Every call goes through one client (client.go); a test holds
// each request it sends to api/openapi.json. What the frame builders
// share: the column helpers (frames.go), the numeric format (numeric.go),
// the distribution band (spread.go), units (units.go) and a run's time
// window (window.go).
package plugin

import (
	"context"
	"errors"
	"net/http"
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
	rows := 0
	for _, f := range frames {
		f.RefID = dq.RefID
		rows += f.Rows()
	}
	if rows == 0 && q.QueryType != api.QueryAnnotations {
		for i, f := range frames {
			frames[i] = withoutFields(f)
		}
	}
	return backend.DataResponse{Frames: frames}
}

// withoutFields is f (its name, query and notices) without its columns, for
// an answer without a row: Grafana draws a table of columns and no rows as
// an empty box of headers, and says the panel's no-data sentence only for
// frames without fields. An answer with rows in any frame keeps every
// frame's columns (a panel may pick one frame of several), and an annotation
// query keeps them: Grafana reads their names.
func withoutFields(f *data.Frame) *data.Frame {
	out := data.NewFrame(f.Name)
	out.RefID, out.Meta = f.RefID, f.Meta
	return out
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

// run answers one query with its type of [queryTypes].
func (d *Datasource) run(ctx context.Context, q api.PluginQuery, dq backend.DataQuery) (data.Frames, error) {
	t, ok := queryTypes[q.QueryType]
	if !ok {
		return nil, &QueryError{Field: "queryType", Msg: "unknown " + q.QueryType}
	}
	return t.answer.run(ctx, d, request{PluginQuery: q, timeRange: dq.TimeRange, maxDataPoints: dq.MaxDataPoints, now: time.Now()})
}
