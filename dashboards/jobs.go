package dashboards

import (
	"github.com/grafana/grafana-foundation-sdk/go/bargauge"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"

	"github.com/deepseed/deepseed/api"
)

// Variables of the jobs dashboard.
const (
	varState  = "state"
	varMetric = "metric"
	varGoal   = "goal"
)

// stateColours colour a job's state alike in every table: running and
// queued in blues, finished green, failed red, lost orange, cancelled grey.
var stateColours = []struct{ state, colour string }{
	{"queued", "blue"},
	{"running", "super-light-blue"},
	{"finished", "green"},
	{"failed", "red"},
	{"cancelled", "gray"},
	{"lost", "orange"},
}

func stateMappings() []dashboard.ValueMapping {
	opts := make(map[string]dashboard.ValueMappingResult, len(stateColours))
	for i, s := range stateColours {
		opts[s.state] = dashboard.ValueMappingResult{Color: ptr(s.colour), Index: ptr(int32(i))}
	}
	return []dashboard.ValueMapping{{ValueMap: &dashboard.ValueMap{Type: dashboard.MappingTypeValueToText, Options: opts}}}
}

// trainingRunURL opens the Training run dashboard on a table row's run,
// over the run's window (the frame's hidden run_from and run_to), as the
// dashboards' own run links do.
const trainingRunURL = "/d/" + UIDTrainingRun + "?var-" + varProject + "=${__data.fields.project}&var-" + varRun +
	"=${__value.raw}&from=${__data.fields.run_from}&to=${__data.fields.run_to}"

// jobsQuery is a job query of the picked project and sweep.
func jobsQuery(queryType string) api.PluginQuery {
	return api.PluginQuery{QueryType: queryType, Project: "$" + varProject, Sweep: "$" + varSweep}
}

// jobTableOverrides are the overrides every job table shares: the state
// coloured, runtime and GPU-hours formatted, the run linked to its
// dashboard, the link's window columns hidden.
func jobTableOverrides(p *table.PanelBuilder) *table.PanelBuilder {
	return p.
		OverrideByName("State", []dashboard.DynamicConfigValue{
			prop("custom.cellOptions", map[string]any{"type": "color-background", "mode": "basic"}),
			prop("mappings", stateMappings()),
			prop("custom.width", 90),
		}).
		OverrideByName("Runtime", []dashboard.DynamicConfigValue{prop("unit", "s"), prop("custom.width", 80)}).
		// Today's times without their date.
		OverrideByName("Started", []dashboard.DynamicConfigValue{prop("unit", "dateTimeAsLocalNoDateIfToday"), prop("custom.width", 150)}).
		// Narrow numbers get widths of their own: at Grafana's 150 px a
		// column, pid, exit code and run were pushed off a 1,600-px screen.
		OverrideByName("GPU-hours", []dashboard.DynamicConfigValue{prop("unit", api.GPUHoursUnit), prop("decimals", 2), prop("custom.width", 90)}).
		OverrideByName("GPUs", []dashboard.DynamicConfigValue{prop("custom.width", 60)}).
		OverrideByName("Slurm job / pid", []dashboard.DynamicConfigValue{prop("custom.width", 90)}).
		OverrideByName("Agent", []dashboard.DynamicConfigValue{prop("custom.width", 95)}).
		OverrideByName("Run", []dashboard.DynamicConfigValue{
			prop("links", []any{map[string]any{"title": "Training run of ${__value.raw}", "url": trainingRunURL}}),
			prop("custom.width", 100),
		}).
		OverrideByName("Run from", []dashboard.DynamicConfigValue{prop("custom.hidden", true)}).
		OverrideByName("Run to", []dashboard.DynamicConfigValue{prop("custom.hidden", true)})
}

// jobCounter is a stat of one job counter, in its colour.
func jobCounter(title, field, colour, description string, pos dashboard.GridPos) *stat.PanelBuilder {
	q := jobsQuery(api.QueryJobCounts)
	return statCard(card{title: title, field: field, decimals: 0, description: description, unit: "none"}, pos, q).
		ColorMode(common.BigValueColorModeValue).
		ColorScheme(dashboard.NewFieldColorBuilder().Mode(dashboard.FieldColorModeIdFixed).FixedColor(colour))
}

func jobsDashboard() (dashboard.Dashboard, []Annotation, error) {
	all := func(v *dashboard.QueryVariableBuilder) *dashboard.QueryVariableBuilder {
		return v.IncludeAll(true).AllValue(api.AllValue)
	}
	b := newDashboard(UIDJobs, "DeepSeed · Jobs",
		"Jobs, sweeps and GPU quotas: how many jobs are queued, running, done and failed, each job with its parameters, runtime, GPU-hours, agent and run, each project's GPU-hours against its quota, and a sweep's trials ranked by an eval metric.",
		"jobs").
		Time("now-7d", "now").
		Refresh("30s").
		WithVariable(all(queryVar(varProject, "Project", api.VariableQuery{Resource: api.VariableJobProjects}))).
		WithVariable(all(queryVar(varSweep, "Sweep", api.VariableQuery{Resource: api.VariableJobSweeps, Project: "$" + varProject})).
			Description("All: every job; the trials table then shows the newest sweep.")).
		WithVariable(all(queryVar(varState, "State", api.VariableQuery{Resource: api.VariableJobStates}))).
		WithVariable(queryVar(varMetric, "Metric", api.VariableQuery{Resource: api.VariableSweepMetrics, Sweep: "$" + varSweep, Project: "$" + varProject}).
			Description("Eval metric the sweep's trials are ranked by: the sweep's own first, then its runs' (<split>_loss, <split>_accuracy, <split>_<metric>).")).
		WithVariable(queryVar(varGoal, "Goal", api.VariableQuery{Resource: api.VariableSweepGoals, Sweep: "$" + varSweep, Project: "$" + varProject, Metric: "$" + varMetric}).
			Description("max or min: which end of the metric is best."))

	counters := []struct{ title, field, colour, desc string }{
		{"Total", "total", "text", "Jobs of the project and sweep picked, every state."},
		{"Active", "active", "blue", "Queued or running."},
		{"Done", "done", "green", "Finished: exit status 0."},
		{"Failed", "failed", "red", "Failed (non-zero exit) or lost (their agent went silent)."},
	}
	for i, c := range counters {
		b = b.WithPanel(jobCounter(c.title, c.field, c.colour, c.desc, gridPos(uint32(i)*6, 0, 6, 4)))
	}

	jq := jobsQuery(api.QueryJobs)
	jq.State = "$" + varState
	b = b.WithPanel(jobTableOverrides(dataTable("Jobs",
		"Newest first, up to 1,000: parameters, state, runtime, GPUs and GPU-hours, the agent and the Slurm job id or pid, the exit code; the run opens its Training run dashboard, the sweep filters this dashboard to it.",
		gridPos(0, 4, 24, 11), jq)).
		OverrideByName("Sweep", []dashboard.DynamicConfigValue{
			prop("links", []any{map[string]any{"title": "Jobs of sweep ${__value.raw}",
				"url": "/d/" + UIDJobs + "?var-" + varProject + "=${__data.fields.project}&var-" + varSweep + "=${__value.raw}&var-" + varState + "=" + api.AllValue}}),
			prop("custom.width", 140),
		}).
		OverrideByName("Params", []dashboard.DynamicConfigValue{prop("custom.width", 135)}).
		// Every column on a 1,600-px screen: Submitted, Ended (Started +
		// Runtime), Attempt and the exit code (Detail says "exit status
		// 3") stay in the panel's data, out of the table.
		WithTransformation(dashboard.DataTransformerConfig{
			Id:      "organize",
			Options: map[string]any{"excludeByName": map[string]any{"Submitted": true, "Ended": true, "Attempt": true, "Exit code": true}, "indexByName": map[string]any{}, "renameByName": map[string]any{}},
		}).
		OverrideByName("Job", []dashboard.DynamicConfigValue{prop("custom.width", 50)}).
		OverrideByName("Project", []dashboard.DynamicConfigValue{prop("custom.width", 90)}).
		// What Detail says (exit status 3, why a job was lost) wraps in
		// the room the other columns leave.
		OverrideByName("Detail", []dashboard.DynamicConfigValue{prop("custom.wrapText", true)}))

	b = b.WithPanel(bargauge.NewPanelBuilder().
		Title("GPU quota").
		Description("GPU-hours used per project (jobs' runtime × GPUs held, plus runs no job started) against its quota: a full bar is the limit; orange from 80 %, red once it is reached, when new jobs get 409.").
		Datasource(DatasourceRef()).
		GridPos(gridPos(0, 15, 8, 9)).
		WithTarget(target("A", api.PluginQuery{QueryType: api.QueryQuotas, Project: "$" + varProject})).
		Unit(api.GPUHoursUnit).
		Decimals(1).
		Min(0).
		Thresholds(dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModePercentage).Steps([]dashboard.Threshold{
			{Value: nil, Color: "green"}, {Value: ptr(80.0), Color: "orange"}, {Value: ptr(100.0), Color: "red"},
		})).
		ColorScheme(dashboard.NewFieldColorBuilder().Mode(dashboard.FieldColorModeIdThresholds)).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Values(false).Calcs([]string{"lastNotNull"}).Fields("")).
		DisplayMode(common.BarGaugeDisplayModeGradient).
		ValueMode(common.BarGaugeValueModeText).
		NamePlacement(common.BarGaugeNamePlacementTop).
		ShowUnfilled(true).
		Orientation(common.VizOrientationHorizontal).
		// Grafana hides the name of a bar gauge's only bar unless the
		// panel sets one: with one project picked, the bar still names
		// it and its limit.
		DisplayName("${__field.labels.project} (${__field.labels.limit})").
		NoValue("no quota set"))

	tq := jobsQuery(api.QuerySweepTrials)
	tq.Metric, tq.Goal = "$"+varMetric, "$"+varGoal
	b = b.WithPanel(jobTableOverrides(dataTable("Sweep trials by $metric ($goal)",
		"Each trial of the sweep picked (the newest for All): its parameters beside the final and best value of the metric, best first; trials without a value yet come last.",
		gridPos(8, 15, 16, 9), tq)).
		// Where and how each trial ran is in the Jobs table above: here
		// the trial's parameters and results have the panel's width.
		WithTransformation(dashboard.DataTransformerConfig{
			Id: "organize",
			Options: map[string]any{"excludeByName": map[string]any{"Agent": true, "Slurm job / pid": true,
				"Exit code": true, "Submitted": true, "Started": true, "Ended": true, "GPUs": true, "GPU-hours": true}},
		}).
		OverrideByName("Rank", []dashboard.DynamicConfigValue{prop("custom.width", 60)}).
		// The metric's final and best values, their header its name.
		OverrideByRegexp("/^(Final|Best) /", []dashboard.DynamicConfigValue{prop("custom.width", 115)}))

	// Below the quota and the trials (rows 15 to 24).
	b, _ = jobsLedger(b, 24)

	d, err := b.Build()
	return d, nil, err
}
