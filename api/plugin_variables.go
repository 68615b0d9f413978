package api

// VariableQuery is the JSON model of a Grafana template variable of the
// DeepSeed data source: which list to fetch (one of the VariableResource
// constants) and its filters. The provisioned dashboards write it, the
// plugin's variable editor edits it, and the plugin fetches the list from
// its backend resource of the same name. Template variables in the
// filters ($project, $run) are interpolated before the list is fetched.
type VariableQuery struct {
	RefID    string `json:"refId,omitempty"`
	Resource string `json:"resource"`

	Project string `json:"project,omitempty"` // runs, sweeps, job_sweeps; window: the project whose newest run "*" stands for
	Sweep   string `json:"sweep,omitempty"`   // runs, sweep_metrics, sweep_goals
	Tag     string `json:"tag,omitempty"`     // runs
	Status  string `json:"status,omitempty"`  // runs
	Run     string `json:"run,omitempty"`     // metrics, ranks, hosts, window
	Part    string `json:"part,omitempty"`    // window: span, shift, from or to
	Metric  string `json:"metric,omitempty"`  // sweep_goals

	// Baseline (runs): the list offers baselines, led by
	// [BaselineOptionText] whose value is [BaselineFirst].
	Baseline bool `json:"baseline,omitempty"`
}

// BaselineOptionText is the text of the baseline list's first option,
// the first of the runs selected.
const BaselineOptionText = "First selected run"

// Resources of [VariableQuery]: the plugin backend serves each as a GET
// resource answering a list of {text, value}.
const (
	VariableProjects = "projects" // distinct projects of all runs
	VariableRuns     = "runs"     // runs filtered by project, sweep, tag, status; value: run id
	VariableSweeps   = "sweeps"   // distinct non-empty sweep ids of two runs or more, filtered by project
	VariableMetrics  = "metrics"  // series metrics, a run's own metrics.NAME included
	VariableRanks    = "ranks"    // ranks of a run
	VariableHosts    = "hosts"    // hosts with GPU samples, of a run or the time range
	VariableWindow   = "window"   // one part of a run's time window; see WindowParts

	VariableJobProjects  = "job_projects"  // distinct projects of jobs and quotas
	VariableJobSweeps    = "job_sweeps"    // sweep ids of jobs, newest first, filtered by project
	VariableJobStates    = "job_states"    // the states a job can be in
	VariableSweepMetrics = "sweep_metrics" // eval metrics a sweep's trials can be ranked by, its own first
	VariableSweepGoals   = "sweep_goals"   // min and max, the one that suits the metric first
)

// WindowParts are the parts of a run's time window that the window
// resource answers, each as the one option of a hidden variable:
//
//	span   the run's length with a margin, as a Grafana relative time ("5400s"):
//	       a panel's relative time (timeFrom)
//	shift  how long ago the run ended, plus the margin ("86400s", "0s" while it
//	       runs): a panel's time shift (timeShift)
//	from   the window's start in epoch milliseconds: a link's from=
//	to     the window's end in epoch milliseconds: a link's to=
//
// A panel with timeFrom $run_span and timeShift $run_shift shows the run's
// whole window while the dashboard's range is relative ("Last 7 days"),
// whatever that range is.
var WindowParts = []string{"span", "shift", "from", "to"}

// VariableResources lists every resource a [VariableQuery] may name.
var VariableResources = []string{VariableProjects, VariableRuns, VariableSweeps, VariableMetrics, VariableRanks, VariableHosts, VariableWindow,
	VariableJobProjects, VariableJobSweeps, VariableJobStates, VariableSweepMetrics, VariableSweepGoals}
