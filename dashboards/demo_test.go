package dashboards_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
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
	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/server/servertest"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

// knownBlank are panels known to be blank on the demo, each with the
// reason; the test logs them instead of failing, and fails once one shows
// data, so the list only shrinks. None is: the demo's hosts between them
// carry every counter the dashboards chart.
var knownBlank = map[string]string{
	// The demo loads finished, healthy runs through the API without the
	// detectors' evaluator: no alert is open. server/alerts_test.go proves
	// alerts open and resolve.
	"deepseed-ranks/Open alerts": "no open alert on the demo's finished runs",
	// No demo run hangs; the plugin's TestHangReportsTable fills the table.
	"deepseed-training-run/Hang reports": "no hang on the demo's runs",
	// The demo's numbers hold: the panel says "All numbers consistent";
	// the plugin's TestConsistencyTable fills it.
	"deepseed-training-run/Consistency": "the demo's runs break no invariant",
	// Scores (stored by that evaluator, or computed on read for a run it
	// never scored) and lateness need two ranks, while the run picked here
	// has one. query/final_scores_test.go and the plugin's rank series
	// golden files show both charts' data.
	"deepseed-ranks/Straggler score per rank": "the demo's BERT run has one rank: no straggler score",
	"deepseed-ranks/Lateness per rank":        "the demo's BERT run has one rank: nobody arrives late",
}

// demoBERT is the demo's richest run: layers, evaluations, overflow
// skips, checkpoints and GPU samples.
const demoBERT = "demo-bert-large-zero2-fp16-offload"

// TestDashboardsShowTheDemo loads the demo into a real server and runs
// every panel query of every committed dashboard through the plugin, the
// dashboard's variables set as a user would pick them, and checks what the
// user would see: each panel gets a frame with rows, and every field its
// overrides, reduce options and transformations name is in those frames.
// A plugin change that renames a field fails here instead of leaving a
// panel blank.
func TestDashboardsShowTheDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("loads the demo runs")
	}
	base, readToken, ingestToken := startServer(t)
	anchor := time.Date(2026, 5, 4, 12, 30, 0, 0, time.UTC)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := demo.Load(ctx, demo.Options{Server: base, Token: ingestToken, Anchor: anchor}); err != nil {
		t.Fatalf("load demo: %v", err)
	}
	// The demo has no agent, so no jobs: a real agent runs a small sweep
	// for the Jobs dashboard (project imdb; the other dashboards are
	// looked at on the demo's project).
	seed := jobstest.Seed(t, jobstest.Server{URL: base, Submit: dashSubmitToken, Agent: dashAgentToken, Ingest: ingestToken}, "imdb")
	t.Log(seed)
	inst, err := plugin.NewDatasource(ctx, backend.DataSourceInstanceSettings{
		UID: dashboards.DatasourceUID, Name: "DeepSeed",
		JSONData:                []byte(fmt.Sprintf(`{"url":%q}`, base)),
		DecryptedSecureJSONData: map[string]string{"token": readToken},
	})
	if err != nil {
		t.Fatal(err)
	}
	ds := inst.(*plugin.Datasource)
	// The demo's whole timeline, as a user looking at its runs would pick.
	timeRange := backend.TimeRange{From: fleettest.DemoEpoch(anchor).Add(-time.Hour), To: anchor.Add(time.Hour)}

	for _, d := range dashboards.All() {
		t.Run(d.UID, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join(jsonDir, d.File()))
			if err != nil {
				t.Fatal(err)
			}
			var doc fullDashboard
			if err := json.Unmarshal(raw, &doc); err != nil {
				t.Fatal(err)
			}
			vars, offered := pickVariables(ctx, t, ds, doc, timeRange)
			raws := map[int]rawPanel{}
			for _, r := range rawPanels(t, d.UID) {
				id, _ := r["id"].(float64)
				raws[int(id)] = r
			}
			// A panel of one host's GPUs is drawn for the host picked;
			// it is blank only when blank for every host the picker
			// offers (an NVLink chart of a T4 host has nothing to draw,
			// that of an H100 host has).
			for _, p := range doc.Panels {
				if p.Type == "row" {
					continue
				}
				t.Run(fmt.Sprintf("%d %s", p.ID, p.Title), func(t *testing.T) {
					frames, err := runPanel(ctx, ds, p, vars, timeRange)
					if errors.Is(err, errBlank) && panelUses(p, "$"+"host") {
						for _, v := range offered["host"] {
							each := maps.Clone(vars)
							each["host"] = v
							if frames, err = runPanel(ctx, ds, p, each, timeRange); !errors.Is(err, errBlank) {
								break
							}
						}
					}
					if why, known := knownBlank[d.UID+"/"+p.Title]; known {
						if err == nil {
							t.Errorf("panel shows data now; remove it from knownBlank (%s)", why)
						} else {
							t.Logf("known blank: %s (%v)", why, err)
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					checkPanelFields(t, p, frames)
					checkStepFrames(t, p, frames)
					if p.Type == "table" {
						checkTableFits(t, raws[p.ID], frames)
					}
				})
			}
			for _, a := range doc.Annotations.List {
				if a.Datasource.Type != dashboards.PluginID {
					continue
				}
				// A run without restarts has no restart annotations: an
				// empty annotation is fine, a failed or misshapen one not.
				t.Run("annotation "+a.Name, func(t *testing.T) {
					frames, err := runPanel(ctx, ds, fullPanel{Title: a.Name, Targets: []json.RawMessage{a.Target}}, vars, timeRange)
					if err != nil && !errors.Is(err, errBlank) {
						t.Fatal(err)
					}
					if len(frames) == 0 || frames[0].Fields[0].Name != "time" {
						t.Errorf("annotation frames %v have no time first", frames)
					}
				})
			}
		})
	}
}

// fullDashboard is what a panel check reads of a dashboard's JSON.
type fullDashboard struct {
	Panels     []fullPanel `json:"panels"`
	Templating struct {
		List []templateVariable `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []struct {
			Name       string          `json:"name"`
			Datasource datasourceRef   `json:"datasource"`
			Target     json.RawMessage `json:"target"`
		} `json:"list"`
	} `json:"annotations"`
}

// templateVariable is a dashboard variable as the dashboard JSON holds it.
type templateVariable struct {
	Name  string            `json:"name"`
	Query api.VariableQuery `json:"query"`
	Multi bool              `json:"multi"`
	// IncludeAll offers "All" in the picker.
	IncludeAll bool `json:"includeAll"`
	// AllValue is the value of "All" where a single-value picker offers
	// it; Grafana selects it on first load.
	AllValue string `json:"allValue"`
}

type fullPanel struct {
	ID          int               `json:"id"`
	Type        string            `json:"type"`
	Repeat      string            `json:"repeat"`
	Title       string            `json:"title"`
	Targets     []json.RawMessage `json:"targets"`
	FieldConfig struct {
		Overrides []struct {
			Matcher struct {
				ID      string `json:"id"`
				Options any    `json:"options"`
			} `json:"matcher"`
		} `json:"overrides"`
	} `json:"fieldConfig"`
	Options struct {
		ReduceOptions *struct {
			Fields string `json:"fields"`
		} `json:"reduceOptions"`
		XField string `json:"xField"`
	} `json:"options"`
	Transformations []struct {
		ID      string          `json:"id"`
		Options json.RawMessage `json:"options"`
	} `json:"transformations"`
}

// pickVariables resolves the dashboard's variables in order through the
// plugin's own variable resources, as Grafana does on load, and picks what
// a user looking at the demo would: the BERT run, the first sweep, host
// and baseline offered. Every list must offer something. It returns the
// picks and every value each variable offered.
func pickVariables(ctx context.Context, t *testing.T, ds *plugin.Datasource, doc fullDashboard, tr backend.TimeRange) (vars map[string]string, offered map[string][]string) {
	t.Helper()
	vars, offered = make(map[string]string), make(map[string][]string)
	for _, v := range doc.Templating.List {
		q := v.Query
		params := variableParams(q)
		if q.Resource == api.VariableHosts || q.Resource == api.VariableWindow {
			params["from"], params["to"] = tr.From.Format(time.RFC3339), tr.To.Format(time.RFC3339)
		}
		var qs []string
		for k, val := range params {
			if val = interpolate(val, vars); val != "" {
				qs = append(qs, k+"="+val)
			}
		}
		slices.Sort(qs)
		opts := callResource(ctx, t, ds, q.Resource, strings.Join(qs, "&"))
		if len(opts) == 0 {
			t.Fatalf("variable %s (%+v) offers nothing on the demo", v.Name, q)
		}
		pick := opts[0].Value
		// The agent's runs are the newest, so Grafana would open on
		// their project: the demo's is the one with every kind of data.
		if v.Name == "project" && slices.ContainsFunc(opts, func(o plugin.Option) bool { return o.Value == fleettest.DemoProject }) {
			pick = fleettest.DemoProject
		}
		// The baseline stays on the first selected run, the option
		// Grafana opens on.
		if v.Name == "run" {
			for _, o := range opts {
				if o.Value == demoBERT {
					pick = o.Value
				}
			}
		}
		if v.AllValue != "" && !v.Multi {
			pick = v.AllValue
		}
		vars[v.Name] = pick
		for _, o := range opts {
			offered[v.Name] = append(offered[v.Name], o.Value)
		}
	}
	return vars, offered
}

// variableParams is the query string a variable's resource call
// carries, as the frontend's variableParams writes it.
func variableParams(q api.VariableQuery) map[string]string {
	p := map[string]string{"project": q.Project, "sweep": q.Sweep, "tag": q.Tag, "status": q.Status, "run": q.Run, "part": q.Part, "metric": q.Metric}
	if q.Baseline {
		p["baseline"] = "true"
	}
	return p
}

func callResource(ctx context.Context, t *testing.T, ds *plugin.Datasource, path, query string) []plugin.Option {
	t.Helper()
	var s resourceSink
	err := ds.CallResource(ctx, &backend.CallResourceRequest{Path: path, Method: http.MethodGet, URL: path + "?" + query}, &s)
	if err != nil || s.resp == nil || s.resp.Status != http.StatusOK {
		t.Fatalf("resource %s?%s: %v %+v", path, query, err, s.resp)
	}
	var opts []plugin.Option
	if err := json.Unmarshal(s.resp.Body, &opts); err != nil {
		t.Fatalf("resource %s: %v", path, err)
	}
	return opts
}

type resourceSink struct{ resp *backend.CallResourceResponse }

func (s *resourceSink) Send(r *backend.CallResourceResponse) error { s.resp = r; return nil }

var varRef = regexp.MustCompile(`\$\{?(\w+)\}?`)

// interpolate replaces $name and ${name} as Grafana's template service
// does for a single value.
func interpolate(s string, vars map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		name := strings.Trim(m, "${}")
		if v, ok := vars[name]; ok {
			return v
		}
		return m
	})
}

// panelUses reports whether a target of p names ref ("$host").
func panelUses(p fullPanel, ref string) bool {
	for _, raw := range p.Targets {
		if strings.Contains(string(raw), ref) {
			return true
		}
	}
	return false
}

// errBlank is a panel whose queries succeed with no rows.
var errBlank = errors.New("blank on the demo")

// runPanel runs a panel's targets through QueryData and returns their
// frames; an error when a query fails or no frame has rows.
func runPanel(ctx context.Context, ds *plugin.Datasource, p fullPanel, vars map[string]string, tr backend.TimeRange) (data.Frames, error) {
	req := &backend.QueryDataRequest{}
	for i, raw := range p.Targets {
		var tg struct {
			RefID string `json:"refId"`
		}
		_ = json.Unmarshal(raw, &tg)
		if tg.RefID == "" {
			tg.RefID = fmt.Sprint(i)
		}
		req.Queries = append(req.Queries, backend.DataQuery{RefID: tg.RefID, JSON: json.RawMessage(interpolate(string(raw), vars)),
			TimeRange: tr, MaxDataPoints: 1000, Interval: time.Minute})
	}
	resp, err := ds.QueryData(ctx, req)
	if err != nil {
		return nil, err
	}
	var frames data.Frames
	rows := 0
	for _, q := range req.Queries {
		r := resp.Responses[q.RefID]
		if r.Error != nil {
			return nil, fmt.Errorf("query %s %s: %w", q.RefID, q.JSON, r.Error)
		}
		for _, f := range r.Frames {
			rows += f.Rows()
		}
		frames = append(frames, r.Frames...)
	}
	if rows == 0 {
		return frames, fmt.Errorf("panel %q: %d frames, no rows (variables %v): %w", p.Title, len(frames), vars, errBlank)
	}
	return frames, nil
}

// fieldNames are the names Grafana's matchers compare: each field's name
// and the display name the plugin gives it.
func fieldNames(frames data.Frames) []string {
	var out []string
	for _, f := range frames {
		for _, fl := range f.Fields {
			out = append(out, fl.Name)
			if fl.Config != nil {
				for _, n := range []string{fl.Config.DisplayName, fl.Config.DisplayNameFromDS} {
					if n != "" {
						out = append(out, n)
					}
				}
			}
		}
	}
	return out
}

// displayNames are the names Grafana shows for the frames' fields: the
// display name the plugin gives, else the field's name.
func displayNames(frames data.Frames) []string {
	var out []string
	for _, f := range frames {
		for _, fl := range f.Fields {
			name := fl.Name
			if fl.Config != nil {
				name = cmp.Or(fl.Config.DisplayName, fl.Config.DisplayNameFromDS, name)
			}
			out = append(out, name)
		}
	}
	return out
}

// grafanaRegexp compiles a field-matcher pattern as Grafana reads it:
// /body/flags, or a bare regular expression.
func grafanaRegexp(t *testing.T, pattern string) *regexp.Regexp {
	t.Helper()
	body, flags := pattern, ""
	if strings.HasPrefix(pattern, "/") {
		if i := strings.LastIndex(pattern, "/"); i > 0 {
			body, flags = pattern[1:i], pattern[i+1:]
		}
	}
	if strings.Contains(flags, "i") {
		body = "(?i)" + body
	}
	re, err := regexp.Compile(body)
	if err != nil {
		t.Fatalf("field pattern %q: %v", pattern, err)
	}
	return re
}

func checkPanelFields(t *testing.T, p fullPanel, frames data.Frames) {
	t.Helper()
	// Grafana's byName and byRegexp matchers compare display names.
	names := displayNames(frames)
	matches := func(re *regexp.Regexp) []string {
		var out []string
		for _, n := range names {
			if re.MatchString(n) {
				out = append(out, n)
			}
		}
		return out
	}
	for _, o := range p.FieldConfig.Overrides {
		opt, _ := o.Matcher.Options.(string)
		switch o.Matcher.ID {
		case "byName":
			if !slices.Contains(names, opt) && !(bandFields(t, p)[opt] && !hasBand(t, p, frames)) {
				t.Errorf("override byName %q: no such field in %v", opt, names)
			}
		case "byRegexp":
			// The marks of NaN losses come only with a NaN loss, a
			// straggler's series only with a straggler.
			if len(matches(grafanaRegexp(t, opt))) == 0 && !strings.Contains(opt, api.NonFiniteSuffix) && opt != dashboards.StragglerSeries {
				t.Errorf("override byRegexp %q matches none of %v", opt, names)
			}
		}
	}
	// Grafana matches a stat's fields by display name alone: a card
	// whose pattern names only the field's wire name shows "–".
	if ro := p.Options.ReduceOptions; ro != nil && ro.Fields != "" {
		re, shown := grafanaRegexp(t, ro.Fields), displayNames(frames)
		if !slices.ContainsFunc(shown, re.MatchString) {
			t.Errorf("reduceOptions.fields %q matches no display name of %v", ro.Fields, shown)
		}
	}
	for _, tr := range p.Transformations {
		switch tr.ID {
		case "joinByField":
			// Every frame must hold the key, or the join leaves it out.
			var o struct {
				ByField string `json:"byField"`
			}
			_ = json.Unmarshal(tr.Options, &o)
			for _, f := range frames {
				if !slices.Contains(fieldNames(data.Frames{f}), o.ByField) {
					t.Errorf("joinByField %q: frame %q has no such field: %v", o.ByField, f.Name, fieldNames(data.Frames{f}))
				}
			}
		case "filterFieldsByName":
			var o struct {
				Include struct {
					Pattern string   `json:"pattern"`
					Names   []string `json:"names"`
				} `json:"include"`
			}
			_ = json.Unmarshal(tr.Options, &o)
			for _, n := range o.Include.Names {
				if !slices.Contains(names, n) {
					t.Errorf("filterFieldsByName keeps %q: no such field in %v", n, names)
				}
			}
			if o.Include.Pattern != "" {
				checkFilterKeepsChart(t, frames, grafanaRegexp(t, o.Include.Pattern), stringConversions(p))
			}
		case "convertFieldType":
			var o struct {
				Conversions []struct {
					TargetField string `json:"targetField"`
				} `json:"conversions"`
			}
			_ = json.Unmarshal(tr.Options, &o)
			for _, c := range o.Conversions {
				if !slices.Contains(names, c.TargetField) {
					t.Errorf("convertFieldType of %q: no such field in %v", c.TargetField, names)
				}
			}
		case "sortBy":
			var o struct {
				Sort []struct {
					Field string `json:"field"`
				} `json:"sort"`
			}
			_ = json.Unmarshal(tr.Options, &o)
			for _, by := range o.Sort {
				if !slices.Contains(names, by.Field) {
					t.Errorf("sortBy %q: no such field in %v", by.Field, names)
				}
			}
		case "organize":
			var o map[string]map[string]any
			_ = json.Unmarshal(tr.Options, &o)
			for _, key := range []string{"excludeByName", "indexByName", "renameByName"} {
				for n := range o[key] {
					if !slices.Contains(names, n) {
						t.Errorf("organize %s names %q: no such field in %v", key, n, names)
					}
				}
			}
		}
	}
}

// checkStepFrames checks what a step chart or heatmap draws: x is the
// step, a number, ascending in every frame (the Trend panel refuses
// anything else); a heatmap is one heatmap-rows frame, then one number
// field per layer.
func checkStepFrames(t *testing.T, p fullPanel, frames data.Frames) {
	t.Helper()
	switch p.Type {
	case "trend":
		if p.Options.XField == "" || !slices.Contains(fieldNames(frames), p.Options.XField) {
			t.Errorf("xField %q: not among %v", p.Options.XField, fieldNames(frames))
		}
	case "heatmap":
		if len(frames) != 1 || frames[0].Meta == nil || frames[0].Meta.Type != plugin.FrameTypeHeatmapRows {
			t.Fatalf("heatmap: %d frames, want one heatmap-rows frame", len(frames))
		}
		for _, fl := range frames[0].Fields[1:] {
			if !fl.Type().Numeric() || strings.TrimSpace(fl.Name) == "" {
				t.Errorf("heatmap row %q is %s, want a named number field", fl.Name, fl.Type())
			}
		}
	default:
		return
	}
	for _, f := range frames {
		x := f.Fields[0]
		if x.Name != "step" || !x.Type().Numeric() {
			t.Errorf("frame %q: x is %q %s, want the step", f.Name, x.Name, x.Type())
			continue
		}
		for i := 1; i < x.Len(); i++ {
			a, _ := x.FloatAt(i - 1)
			b, _ := x.FloatAt(i)
			if b <= a {
				t.Errorf("frame %q: steps not ascending at row %d (%v, %v)", f.Name, i, a, b)
				break
			}
		}
	}
}

// checkFilterKeepsChart checks that a field filter leaves a chart to draw:
// a label field (a string, or a number the panel converts to one, named in
// toString) and a number field, both by name or display name.
func checkFilterKeepsChart(t *testing.T, frames data.Frames, re *regexp.Regexp, toString []string) {
	t.Helper()
	var label, number bool
	for _, f := range frames {
		for _, fl := range f.Fields {
			n := []string{fl.Name}
			if fl.Config != nil {
				n = append(n, fl.Config.DisplayName, fl.Config.DisplayNameFromDS)
			}
			if !slices.ContainsFunc(n, func(s string) bool { return s != "" && re.MatchString(s) }) {
				continue
			}
			switch {
			case fl.Type().Numeric() && !slices.ContainsFunc(n, func(s string) bool { return slices.Contains(toString, s) }):
				number = true
			default:
				label = true
			}
		}
	}
	if !label || !number {
		t.Errorf("filter %s keeps label field %v, number field %v: the chart has nothing to draw", re, label, number)
	}
}

// stringConversions lists the fields a panel's convertFieldType turns
// into strings.
func stringConversions(p fullPanel) []string {
	var out []string
	for _, tr := range p.Transformations {
		if tr.ID != "convertFieldType" {
			continue
		}
		var o struct {
			Conversions []struct {
				TargetField     string `json:"targetField"`
				DestinationType string `json:"destinationType"`
			} `json:"conversions"`
		}
		_ = json.Unmarshal(tr.Options, &o)
		for _, c := range o.Conversions {
			if c.DestinationType == "string" {
				out = append(out, c.TargetField)
			}
		}
	}
	return out
}

// Tokens of the scopes that queue and run jobs.
const (
	dashSubmitToken = "dash-submit-token"
	dashAgentToken  = "dash-agent-token"
)

// startServer runs a real DeepSeed server, ingest and query with tokens,
// jobs included, on a fresh database.
func startServer(t testing.TB) (base, readToken, ingestToken string) {
	t.Helper()
	return startServerOn(t, storetest.NewStore(t))
}

// startServerOn is startServer on the store st.
func startServerOn(t testing.TB, st *store.Store) (base, readToken, ingestToken string) {
	t.Helper()
	readToken, ingestToken = "dash-read-token", "dash-ingest-token"
	cfg := server.DefaultConfig()
	cfg.IngestTokens = []string{ingestToken}
	cfg.ReadTokens = []string{readToken}
	cfg.SubmitTokens, cfg.AgentTokens = []string{dashSubmitToken}, []string{jobstest.AgentName + ":" + dashAgentToken}
	return servertest.Start(t, cfg, st), readToken, ingestToken
}
