// Package dashboards builds DeepSeed's provisioned Grafana dashboards from
// Go with the Grafana Foundation SDK, so that every panel query is an
// [api.PluginQuery] checked by the compiler and by tests, and Grafana's
// alert rules from the server's detectors (detect.Table), one rule each.
// It depends on no database code.
//
// Usage:
//
//  1. go run ./dashboards/gen writes dashboards/json/<uid>.json and
//     [AlertRulesFile];
//  2. Grafana's dashboard provider (dashboards/provisioning) loads that folder,
//     and its alerting provisioning that file;
//  3. go test ./dashboards fails when the committed JSON drifts from [All],
//     or the committed rules from [RenderAlerting].
package dashboards

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"

	"github.com/deepseed/deepseed/api"
)

// Stable dashboard UIDs: links, the home dashboard setting and bookmarks
// depend on them.
const (
	UIDTrainingRun = "deepseed-training-run"
	UIDCompare     = "deepseed-compare"
	UIDRanks       = "deepseed-ranks"
	UIDGPUNodes    = "deepseed-gpu-nodes"
	UIDJobs        = "deepseed-jobs"
)

// Dashboard is one generated dashboard.
type Dashboard struct {
	UID   string
	Build func() (dashboard.Dashboard, []Annotation, error)
}

// File is the name of the dashboard's JSON file under dashboards/json.
func (d Dashboard) File() string { return d.UID + ".json" }

// All lists every provisioned dashboard.
func All() []Dashboard {
	return []Dashboard{
		{UIDTrainingRun, trainingRun},
		{UIDCompare, compare},
		{UIDRanks, ranks},
		{UIDGPUNodes, gpuNodes},
		{UIDJobs, jobsDashboard},
	}
}

// Annotation is a dashboard annotation fed by a DeepSeed query. The SDK's
// annotation type only knows the built-in Grafana target, so these are
// spliced into the JSON by [Render].
type Annotation struct {
	Name       string               `json:"name"`
	Enable     bool                 `json:"enable"`
	Hide       bool                 `json:"hide"`
	IconColor  string               `json:"iconColor"`
	Datasource common.DataSourceRef `json:"datasource"`
	Target     Query                `json:"target"`
}

// Render builds d and returns its JSON as committed under dashboards/json.
func Render(d Dashboard) ([]byte, error) {
	built, annotations, err := d.Build()
	if err != nil {
		return nil, fmt.Errorf("dashboards: build %s: %w", d.UID, err)
	}
	raw, err := json.Marshal(built)
	if err != nil {
		return nil, fmt.Errorf("dashboards: marshal %s: %w", d.UID, err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("dashboards: reread %s: %w", d.UID, err)
	}
	// Grafana's own "Annotations & Alerts" entry comes first, as in a
	// dashboard saved from the UI, then the run events.
	list := []any{map[string]any{
		"builtIn":    1,
		"datasource": map[string]any{"type": "grafana", "uid": "-- Grafana --"},
		"enable":     true,
		"hide":       true,
		"iconColor":  "rgba(0, 211, 255, 1)",
		"name":       "Annotations & Alerts",
		"type":       "dashboard",
	}}
	for _, a := range annotations {
		list = append(list, a)
	}
	doc["annotations"] = map[string]any{"list": list}
	// id null lets Grafana assign its own on provisioning.
	doc["id"] = nil
	// Panel ids must be unique within a dashboard: links, "view panel"
	// and the repeat of rows rely on them.
	if panels, ok := doc["panels"].([]any); ok {
		for i, p := range panels {
			if m, ok := p.(map[string]any); ok {
				m["id"] = i + 1
				dropZeroTickLength(m)
			}
		}
	}

	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("dashboards: encode %s: %w", d.UID, err)
	}
	return buf.Bytes(), nil
}

// dropZeroTickLength removes a bar chart's xTickLabelMaxLength of 0, which
// the SDK always writes and Grafana reads as "cut every bar label to
// nothing" (each shows "…"); absent, labels are shown whole.
func dropZeroTickLength(panel map[string]any) {
	opts, ok := panel["options"].(map[string]any)
	if !ok {
		return
	}
	if v, ok := opts["xTickLabelMaxLength"].(float64); ok && v == 0 {
		delete(opts, "xTickLabelMaxLength")
	}
}

// RenderAll renders every dashboard, keyed by file name.
func RenderAll() (map[string][]byte, error) {
	out := make(map[string][]byte)
	for _, d := range All() {
		b, err := Render(d)
		if err != nil {
			return nil, err
		}
		out[d.File()] = b
	}
	return out, nil
}

// Variable names, used as $name in queries.
const (
	varProject  = "project"
	varRun      = "run"
	varSweep    = "sweep"
	varBaseline = "baseline"
	varHost     = "host"
	varRank     = "rank"
)

// queryVar is a template variable fed by one of the plugin's variable
// resources; q is exactly what the plugin's variable support reads.
func queryVar(name, label string, q api.VariableQuery) *dashboard.QueryVariableBuilder {
	q.RefID = "var-" + name
	raw, err := json.Marshal(q)
	if err != nil {
		panic(err) // an api.VariableQuery always marshals
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		panic(err)
	}
	return dashboard.NewQueryVariableBuilder(name).
		Label(label).
		Datasource(DatasourceRef()).
		Query(dashboard.StringOrMap{Map: m}).
		Refresh(dashboard.VariableRefreshOnDashboardLoad).
		Sort(dashboard.VariableSortDisabled)
}

// Hidden variables holding the parts of $run's time window (see
// api.WindowParts), and the panel time override they make.
const (
	varRunSpan  = "run_span"
	varRunShift = "run_shift"
	varRunFrom  = "run_from"
	varRunTo    = "run_to"

	// RunSpan and RunShift are the timeFrom and timeShift of every time
	// panel of a run-scoped dashboard: while the time picker shows a
	// relative range (the default), the panel shows $run's whole window.
	RunSpan  = "$" + varRunSpan
	RunShift = "$" + varRunShift
)

// windowVars are the hidden variables of $run's window, refreshed with the
// time range so a running run's window grows and an explicit range (a
// link's from and to) turns the shift off.
func windowVars(b *dashboard.DashboardBuilder) *dashboard.DashboardBuilder {
	for _, v := range []struct{ name, part string }{
		{varRunSpan, "span"}, {varRunShift, "shift"}, {varRunFrom, "from"}, {varRunTo, "to"},
	} {
		b = b.WithVariable(queryVar(v.name, "", api.VariableQuery{Resource: api.VariableWindow, Run: "$" + varRun, Project: "$" + varProject, Part: v.part}).
			Hide(dashboard.VariableHideHideVariable).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged))
	}
	return b
}

// runLink opens the dashboard uid on $run with the time picker set to the
// run's window, so time panels there show the run without a click.
func runLink(title, uid string) *dashboard.DashboardLinkBuilder {
	return dashboard.NewDashboardLinkBuilder(title).
		Type(dashboard.DashboardLinkTypeLink).
		Url("/d/" + uid + "?var-" + varProject + "=${" + varProject + "}&var-" + varRun + "=${" + varRun + "}&from=${" + varRunFrom + "}&to=${" + varRunTo + "}").
		Icon("dashboard").
		Tooltip(title + ", over the run's time window").
		TargetBlank(false).
		AsDropdown(false).
		IncludeVars(false).
		KeepTime(false)
}

// projectVar lists the projects that have runs.
func projectVar() *dashboard.QueryVariableBuilder {
	return queryVar(varProject, "Project", api.VariableQuery{Resource: api.VariableProjects})
}

// runVar lists the runs of $project, newest first; its value is the run id
// and its text the run name.
func runVar(multi bool) *dashboard.QueryVariableBuilder {
	v := queryVar(varRun, "Run", api.VariableQuery{Resource: api.VariableRuns, Project: "$" + varProject}).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged)
	if multi {
		v = v.Multi(true).IncludeAll(true).Label("Runs")
	}
	return v
}

func newDashboard(uid, title, description string, tags ...string) *dashboard.DashboardBuilder {
	return dashboard.NewDashboardBuilder(title).
		Uid(uid).
		Description(description).
		Tags(append([]string{"deepseed"}, tags...)).
		Editable().
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		Timezone(common.TimeZoneBrowser).
		Time("now-7d", "now").
		Link(dashboard.NewDashboardLinkBuilder("DeepSeed").
			Type(dashboard.DashboardLinkTypeDashboards).
			Tags([]string{"deepseed"}).
			AsDropdown(true).
			IncludeVars(true).
			KeepTime(true))
}

// gridPos places a panel explicitly, so the layout does not depend on the
// builder's flow.
func gridPos(x, y, w, h uint32) dashboard.GridPos {
	return dashboard.GridPos{X: x, Y: y, W: w, H: h}
}

func row(title string, y uint32) *dashboard.RowBuilder {
	return dashboard.NewRowBuilder(title).GridPos(gridPos(0, y, 24, 1))
}

// fieldRegexp matches a frame field by any of names: its field name
// ("final_loss") or its display name ("Final loss"). Grafana's field
// matchers compare display names, which the plugin sets. Names are
// matched literally: "Peak GPU memory (NVML)" holds no group.
func fieldRegexp(names ...string) string {
	alts := make([]string, len(names))
	for i, n := range names {
		alts[i] = strings.ReplaceAll(regexp.QuoteMeta(n), "_", "[ _]")
	}
	return "/^(" + strings.Join(alts, "|") + ")$/i"
}

func ptr[T any](v T) *T { return &v }
