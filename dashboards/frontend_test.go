package dashboards_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/dashboards"
	"github.com/deepseed/deepseed/demo"
	"github.com/deepseed/deepseed/grafana-plugin/pkg/plugin"
	"github.com/deepseed/deepseed/internal/fleettest"
	"github.com/deepseed/deepseed/jobs/jobstest"
)

// pluginDir is the plugin's frontend, whose interpolation the browser runs.
const pluginDir = "../grafana-plugin"

// renderedQuery is one query as the plugin's frontend hands it to Grafana
// for the backend (src/dashboards.test.ts writes them).
type renderedQuery struct {
	Dashboard string              `json:"dashboard"`
	Variables map[string][]string `json:"variables"`
	Panel     string              `json:"panel"`
	Query     json.RawMessage     `json:"query"`
}

// TestDashboardQueriesThroughTheFrontend renders every target of every
// provisioned dashboard with the plugin's own frontend code
// (applyTemplateVariables under a template service that substitutes the
// variables as Grafana does on load: the first value each variable offers,
// or All where it has an all value), once per run of the demo on the
// run-scoped dashboards, and sends what comes out to a real server through
// the plugin's backend. It fails on any variable left in a query, on any
// query the plugin answers with an error (the Jobs dashboard's $state,
// $metric and $goal failed so in a browser while the hand-substituted
// queries of the other tests passed), and on a panel that, for some run,
// gets no row, no notice and has no noValue to say why.
func TestDashboardQueriesThroughTheFrontend(t *testing.T) {
	if testing.Short() {
		t.Skip("loads the demo runs and runs the plugin's frontend under Node.js")
	}
	npx, err := exec.LookPath("npx")
	if err != nil {
		t.Fatalf("this test runs the plugin's frontend and needs Node.js with npx: %v", err)
	}
	if _, err := os.Stat(filepath.Join(pluginDir, "node_modules", "vitest")); err != nil {
		t.Fatalf("the plugin's npm packages are missing: run npm ci in grafana-plugin (./test.sh does): %v", err)
	}
	base, readToken, ingestToken := startServer(t)
	anchor := time.Date(2026, 5, 4, 12, 30, 0, 0, time.UTC)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := demo.Load(ctx, demo.Options{Server: base, Token: ingestToken, Anchor: anchor}); err != nil {
		t.Fatalf("load demo: %v", err)
	}
	jobstest.Seed(t, jobstest.Server{URL: base, Submit: dashSubmitToken, Agent: dashAgentToken, Ingest: ingestToken}, "imdb")
	inst, err := plugin.NewDatasource(ctx, backend.DataSourceInstanceSettings{
		UID: dashboards.DatasourceUID, Name: "DeepSeed",
		JSONData:                []byte(fmt.Sprintf(`{"url":%q}`, base)),
		DecryptedSecureJSONData: map[string]string{"token": readToken},
	})
	if err != nil {
		t.Fatal(err)
	}
	ds := inst.(*plugin.Datasource)
	tr := backend.TimeRange{From: fleettest.DemoEpoch(anchor).Add(-time.Hour), To: anchor.Add(time.Hour)}

	picks := make(map[string][]map[string][]string)
	// Each panel's one-line reason for showing nothing, by dashboard and
	// title.
	noValue := make(map[string]string)
	for _, d := range dashboards.All() {
		raw, err := os.ReadFile(filepath.Join(jsonDir, d.File()))
		if err != nil {
			t.Fatal(err)
		}
		var doc fullDashboard
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		picks[d.UID] = firstLoadVariables(ctx, t, ds, doc, tr)
		var reasons struct {
			Panels []struct {
				Title       string `json:"title"`
				FieldConfig struct {
					Defaults struct {
						NoValue string `json:"noValue"`
					} `json:"defaults"`
				} `json:"fieldConfig"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(raw, &reasons); err != nil {
			t.Fatal(err)
		}
		for _, p := range reasons.Panels {
			noValue[d.UID+"/"+p.Title] = p.FieldConfig.Defaults.NoValue
		}
	}

	dir := t.TempDir()
	varsFile, queriesFile := filepath.Join(dir, "variables.json"), filepath.Join(dir, "queries.json")
	raw, _ := json.Marshal(picks)
	if err := os.WriteFile(varsFile, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, npx, "vitest", "run", "src/dashboards.test.ts")
	cmd.Dir = pluginDir
	cmd.Env = append(os.Environ(), "DEEPSEED_DASHBOARD_VARIABLES="+varsFile, "DEEPSEED_DASHBOARD_QUERIES="+queriesFile, "CI=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the plugin's frontend left variables in a query (npx vitest run src/dashboards.test.ts): %v\n%s", err, out)
	}
	raw, err = os.ReadFile(queriesFile)
	if err != nil {
		t.Fatalf("the frontend wrote no queries: %v", err)
	}
	var queries []renderedQuery
	if err := json.Unmarshal(raw, &queries); err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]bool)
	// A panel shows data or says why: rows, a notice, or its noValue.
	type panelKey struct{ dashboard, panel, vars string }
	shows := make(map[panelKey]bool)
	for _, q := range queries {
		seen[q.Dashboard] = true
		where := fmt.Sprintf("%s %q with %v", q.Dashboard, q.Panel, q.Variables)
		if left := leftVariable.FindAllString(string(q.Query), -1); len(left) > 0 {
			t.Errorf("%s: %v left in %s", where, left, q.Query)
			continue
		}
		resp, err := ds.QueryData(ctx, &backend.QueryDataRequest{Queries: []backend.DataQuery{{
			RefID: "A", JSON: q.Query, TimeRange: tr, MaxDataPoints: 1000, Interval: time.Minute,
		}}})
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		r := resp.Responses["A"]
		if r.Error != nil {
			t.Errorf("%s: %s answers %v", where, q.Query, r.Error)
		}
		key := panelKey{q.Dashboard, q.Panel, fmt.Sprint(q.Variables)}
		shows[key] = shows[key] || noValue[q.Dashboard+"/"+q.Panel] != "" || strings.HasPrefix(q.Panel, "annotation ")
		for _, f := range r.Frames {
			shows[key] = shows[key] || f.Rows() > 0 || len(frameNotices(f)) > 0
			for _, n := range frameNotices(f) {
				if n.Severity == data.NoticeSeverityError {
					t.Errorf("%s: error notice %q for %s", where, n.Text, q.Query)
				}
			}
		}
	}
	for k, ok := range shows {
		if !ok {
			t.Errorf("%s %q with %s: no data, no notice and no noValue: the panel is blank without a word", k.dashboard, k.panel, k.vars)
		}
	}
	for _, d := range dashboards.All() {
		if !seen[d.UID] {
			t.Errorf("the frontend rendered no query of %s", d.UID)
		}
	}
	t.Logf("%d queries rendered by the frontend and answered by the server", len(queries))
}

// leftVariable is a template variable reference in a query's JSON.
var leftVariable = regexp.MustCompile(`\$\{?\w+|\[\[\w+`)

func frameNotices(f *data.Frame) []data.Notice {
	if f.Meta == nil {
		return nil
	}
	return f.Meta.Notices
}

// firstLoadVariables resolves a dashboard's variables in order through the
// plugin's variable resources and returns the values Grafana gives them
// on first load: All where a variable offers it (its all value, or every
// value of a multi-value variable), else the first value offered. On a
// dashboard with a Run variable it returns one set per run offered, each
// run with the variables that depend on it, so every kind of run the demo
// holds is rendered.
func firstLoadVariables(ctx context.Context, t *testing.T, ds *plugin.Datasource, doc fullDashboard, tr backend.TimeRange) []map[string][]string {
	t.Helper()
	resolve := func(fixed map[string][]string) map[string][]string {
		vars := make(map[string][]string)
		for _, v := range doc.Templating.List {
			q := v.Query
			params := variableParams(q)
			if q.Resource == api.VariableHosts || q.Resource == api.VariableWindow {
				params["from"], params["to"] = tr.From.Format(time.RFC3339), tr.To.Format(time.RFC3339)
			}
			single := make(map[string]string, len(vars))
			for k, vs := range vars {
				single[k] = strings.Join(vs, ",")
			}
			var qs []string
			for k, val := range params {
				if val = interpolate(val, single); val != "" {
					qs = append(qs, k+"="+val)
				}
			}
			slices.Sort(qs)
			opts := callResource(ctx, t, ds, q.Resource, strings.Join(qs, "&"))
			var offered []string
			for _, o := range opts {
				offered = append(offered, o.Value)
			}
			switch {
			case fixed[v.Name] != nil:
				vars[v.Name] = fixed[v.Name]
			case v.AllValue != "":
				vars[v.Name] = []string{v.AllValue}
			case v.Multi && len(offered) > 0:
				vars[v.Name] = offered
			case len(offered) > 0:
				vars[v.Name] = offered[:1]
			default:
				t.Fatalf("variable %s (%+v) offers nothing on the demo", v.Name, q)
			}
		}
		return vars
	}
	first := resolve(nil)
	perRun := slices.ContainsFunc(doc.Templating.List, func(v templateVariable) bool {
		return v.Name == "run" && !v.Multi && v.AllValue == ""
	})
	if !perRun {
		return []map[string][]string{first}
	}
	// One set per run of every project.
	var sets []map[string][]string
	for _, p := range callResource(ctx, t, ds, api.VariableProjects, "") {
		for _, r := range callResource(ctx, t, ds, api.VariableRuns, "project="+p.Value) {
			sets = append(sets, resolve(map[string][]string{"project": {p.Value}, "run": {r.Value}}))
		}
	}
	return sets
}
