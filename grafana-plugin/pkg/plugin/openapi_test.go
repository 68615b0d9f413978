package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"

	"github.com/deepseed/deepseed/api"
)

// TestRequestsFollowOpenAPI puts a recording proxy between the data source
// and a real server holding runs, GPU samples and a sweep of jobs, runs
// every query type (each with every field that becomes a parameter set)
// and every resource, and holds each request the data source sent to
// api/openapi.json: a path and method the document describes, only the
// query parameters it declares for that operation, and values that fit
// their schemas. The data source thus cannot drift from the API; the
// server is held to the same document by the server's and query's tests.
func TestRequestsFollowOpenAPI(t *testing.T) {
	base, seed := startJobServer(t)
	ingest(t, base, fixtureRecords())
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		sent []*http.Request
	)
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sent = append(sent, r.Clone(context.Background()))
		mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)

	ctx := context.Background()
	inst, err := NewDatasource(ctx, backend.DataSourceInstanceSettings{
		UID: "openapi", Name: "DeepSeed openapi", JSONData: []byte(fmt.Sprintf(`{"url":%q}`, front.URL)),
		DecryptedSecureJSONData: map[string]string{"token": readToken},
	})
	if err != nil {
		t.Fatal(err)
	}
	ds := inst.(*Datasource)
	t.Cleanup(ds.Dispose)

	sweep := seed.Sweep.ID
	queries := map[string]string{
		"runs":             `{"queryType":"runs","project":"nlp","sweep":"zero-sweep","tag":"bert","status":"finished"}`,
		"run_summary":      `{"queryType":"run_summary","runId":"bert-z2"}`,
		"run_details":      `{"queryType":"run_details","runId":"bert-z2"}`,
		"run_code":         `{"queryType":"run_code","runId":"bert-z2"}`,
		"series":           `{"queryType":"series","runId":"bert-z2","metrics":["loss","metrics.tokens_seen"],"rank":"all","fromStep":2,"toStep":9}`,
		"series_step":      `{"queryType":"series","runId":"bert-z2","metrics":["step_ms"],"rank":"1","xAxis":"step"}`,
		"heatmap":          `{"queryType":"heatmap","runId":"bert-z2","pass":"backward","rank":"0","maxSteps":5,"fromStep":2,"toStep":9}`,
		"heatmap_points":   `{"queryType":"heatmap","runId":"bert-z2","rank":"all"}`,
		"evals":            `{"queryType":"evals","runId":"bert-z2"}`,
		"breakdown":        `{"queryType":"breakdown","runId":"bert-z2","rank":"1","fromStep":2,"toStep":9}`,
		"memory":           `{"queryType":"memory","runId":"bert-z2"}`,
		"ranks":            `{"queryType":"ranks","runId":"bert-z2","stragglerPct":5}`,
		"compare":          `{"queryType":"compare","runIds":["{bert-z2,bert-z3}"],"sweep":"zero-sweep","baseline":"bert-z2"}`,
		"compare_project":  `{"queryType":"compare","project":"nlp"}`,
		"gpus":             `{"queryType":"gpus","host":"node-a","gpu":"1","runId":"bert-z2","rank":"1","metrics":["util_pct","power_w"]}`,
		"gpus_all":         `{"queryType":"gpus","runId":"*","format":"table"}`,
		"annotations":      `{"queryType":"annotations","runId":"bert-z2","eventTypes":["checkpoint,eval"]}`,
		"annotations_time": `{"queryType":"annotations"}`,
		"alerts":           `{"queryType":"alerts","project":"nlp","runId":"bert-z2","alertKind":"straggler"}`,
		"hang_reports":     `{"queryType":"hang_reports","runId":"bert-z2"}`,
		"consistency":      `{"queryType":"consistency","runId":"bert-z2"}`,
		"regression":       `{"queryType":"regression","runId":"bert-z2","baseline":"{bert-z3}"}`,
		"ledger":           `{"queryType":"ledger","runIds":["{bert-z2,bert-z3}"]}`,
		"ledger_project":   `{"queryType":"ledger","project":"nlp"}`,
		"jobs":             fmt.Sprintf(`{"queryType":"jobs","project":%q,"sweep":%q,"state":"finished"}`, seed.Project, sweep),
		"job_counts":       fmt.Sprintf(`{"queryType":"job_counts","project":%q,"state":"failed"}`, seed.Project),
		"quotas":           `{"queryType":"quotas"}`,
		"quota":            fmt.Sprintf(`{"queryType":"quotas","project":%q}`, seed.Project),
		"sweep_trials":     fmt.Sprintf(`{"queryType":"sweep_trials","sweep":%q,"metric":"val_accuracy","goal":"min"}`, sweep),
		"sweep_newest":     fmt.Sprintf(`{"queryType":"sweep_trials","project":%q}`, seed.Project),
	}
	req := &backend.QueryDataRequest{}
	ran := map[string]bool{}
	for name, q := range queries {
		var pq api.PluginQuery
		if err := json.Unmarshal([]byte(q), &pq); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ran[pq.QueryType] = true
		req.Queries = append(req.Queries, backend.DataQuery{RefID: name, JSON: json.RawMessage(q), MaxDataPoints: 700,
			TimeRange: backend.TimeRange{From: t0.Add(-time.Hour), To: time.Now()}})
	}
	for _, qt := range api.PluginQueryTypes {
		if !ran[qt] {
			t.Errorf("no query of type %s: add one", qt)
		}
	}
	resp, err := ds.QueryData(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range resp.Responses {
		if r.Error != nil {
			t.Errorf("query %s: %v", name, r.Error)
		}
	}

	resources := []string{
		"projects", "runs?project=nlp&sweep=zero-sweep&tag=bert&status=finished", "sweeps?project=nlp",
		"metrics?run=bert-z2", "ranks?run=bert-z2", "hosts?run=bert-z2&from=2024-03-01T11:00:00Z&to=2024-03-01T13:00:00Z",
		"window?run=*&project=nlp&part=span", "window?run=bert-z2&part=from&to=2024-03-01T13:00:00Z",
		"job_projects", "job_sweeps?project=" + seed.Project, "job_states",
		"sweep_metrics?project=" + seed.Project, "sweep_goals?sweep=" + sweep + "&metric=val_loss",
	}
	for _, r := range api.VariableResources {
		if !slices.ContainsFunc(resources, func(c string) bool { return strings.Split(c, "?")[0] == r }) {
			t.Errorf("no call of resource %s: add one", r)
		}
	}
	for _, r := range resources {
		path, _, _ := strings.Cut(r, "?")
		var s sink
		if err := ds.CallResource(ctx, &backend.CallResourceRequest{Path: path, Method: http.MethodGet, URL: r}, &s); err != nil {
			t.Fatal(err)
		}
		if s.resp == nil || s.resp.Status != http.StatusOK {
			t.Errorf("resource %s: %+v", r, s.resp)
		}
	}
	if res, err := ds.CheckHealth(ctx, &backend.CheckHealthRequest{}); err != nil || res.Status != backend.HealthStatusOk {
		t.Errorf("health: %v %+v", err, res)
	}

	ops := loadOperations(t)
	mu.Lock()
	defer mu.Unlock()
	if len(sent) < len(queries)+len(resources) {
		t.Fatalf("the proxy saw %d requests for %d queries and %d resources", len(sent), len(queries), len(resources))
	}
	for _, r := range sent {
		if err := ops.check(r); err != nil {
			t.Errorf("%s %s: %v", r.Method, r.URL, err)
		}
	}
}

// schema is the part of a parameter's JSON schema a query value is held to.
type schema struct {
	Type     string   `json:"type"`
	Enum     []string `json:"enum"`
	Pattern  string   `json:"pattern"`
	Minimum  *float64 `json:"minimum"`
	Maximum  *float64 `json:"maximum"`
	MaxItems *int     `json:"maxItems"`
	Items    *schema  `json:"items"`
}

// check reports why v does not fit the schema.
func (s schema) check(v string) error {
	switch s.Type {
	case "integer", "number":
		f, err := strconv.ParseFloat(v, 64)
		if s.Type == "integer" {
			_, err = strconv.ParseInt(v, 10, 64)
		}
		if err != nil {
			return fmt.Errorf("%q is not of type %s", v, s.Type)
		}
		if (s.Minimum != nil && f < *s.Minimum) || (s.Maximum != nil && f > *s.Maximum) {
			return fmt.Errorf("%s is out of the document's range", v)
		}
	case "string":
		if len(s.Enum) > 0 && !slices.Contains(s.Enum, v) {
			return fmt.Errorf("%q is not one of %v", v, s.Enum)
		}
		if s.Pattern != "" && !regexp.MustCompile(s.Pattern).MatchString(v) {
			return fmt.Errorf("%q does not match %s", v, s.Pattern)
		}
	case "boolean":
		if _, err := strconv.ParseBool(v); err != nil {
			return fmt.Errorf("%q is not of type boolean", v)
		}
	default:
		return fmt.Errorf("the document's type %q is not one this test knows", s.Type)
	}
	return nil
}

type parameter struct {
	Name   string `json:"name"`
	In     string `json:"in"`
	Schema schema `json:"schema"`
}

// operation is one GET of the document, its path as a pattern.
type operation struct {
	path   *regexp.Regexp
	params []parameter
}

type operations []operation

// loadOperations reads the GET operations of api/openapi.json.
func loadOperations(t *testing.T) operations {
	t.Helper()
	var doc struct {
		Paths map[string]map[string]struct {
			Parameters []parameter `json:"parameters"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	var ops operations
	for path, methods := range doc.Paths {
		get, ok := methods["get"]
		if !ok {
			continue
		}
		pattern := regexp.MustCompile(`\\\{([a-z_]+)\\\}`).ReplaceAllString(regexp.QuoteMeta(path), `(?P<$1>[^/]+)`)
		ops = append(ops, operation{path: regexp.MustCompile("^" + pattern + "$"), params: get.Parameters})
	}
	if len(ops) < 15 {
		t.Fatalf("only %d GET operations in api/openapi.json", len(ops))
	}
	return ops
}

// check reports how a request strays from the document.
func (ops operations) check(r *http.Request) error {
	if r.Method != http.MethodGet {
		return fmt.Errorf("the data source only reads, with GET")
	}
	for _, op := range ops {
		m := op.path.FindStringSubmatch(r.URL.EscapedPath())
		if m == nil {
			continue
		}
		param := func(name, in string) (parameter, bool) {
			i := slices.IndexFunc(op.params, func(p parameter) bool { return p.Name == name && p.In == in })
			if i < 0 {
				return parameter{}, false
			}
			return op.params[i], true
		}
		for i, name := range op.path.SubexpNames()[1:] {
			p, ok := param(name, "path")
			if !ok {
				return fmt.Errorf("path parameter %s is not declared", name)
			}
			v, err := url.PathUnescape(m[i+1])
			if err != nil {
				return err
			}
			if err := p.Schema.check(v); err != nil {
				return fmt.Errorf("path parameter %s: %w", name, err)
			}
		}
		for name, vs := range r.URL.Query() {
			p, ok := param(name, "query")
			if !ok {
				return fmt.Errorf("query parameter %s is not in the document's operation", name)
			}
			s := p.Schema
			if s.Type == "array" {
				if s.MaxItems != nil && len(vs) > *s.MaxItems {
					return fmt.Errorf("%d values of %s, the document allows %d", len(vs), name, *s.MaxItems)
				}
				s = *s.Items
			} else if len(vs) > 1 {
				return fmt.Errorf("%s is sent %d times but is not an array", name, len(vs))
			}
			for _, v := range vs {
				if err := s.check(v); err != nil {
					return fmt.Errorf("query parameter %s: %w", name, err)
				}
			}
		}
		return nil
	}
	return fmt.Errorf("no GET of api/openapi.json has this path")
}
