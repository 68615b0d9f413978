package api

// PluginQuery is the JSON model of one Grafana panel query of the DeepSeed
// data source (plugin id deepseed-telemetry-datasource). The provisioned
// dashboards write it, the plugin's query editor edits it, and the
// plugin's backend turns it into query-service calls. Template variables
// ($project, $run, …) are interpolated by Grafana before the backend
// sees the query.
type PluginQuery struct {
	// QueryType selects the query: one of the QueryType constants.
	QueryType string `json:"queryType"`

	Project  string   `json:"project,omitempty"`
	RunID    string   `json:"runId,omitempty"`    // single run
	RunIDs   []string `json:"runIds,omitempty"`   // compare: several runs
	Sweep    string   `json:"sweep,omitempty"`    // runs, compare
	Tag      string   `json:"tag,omitempty"`      // runs
	Status   string   `json:"status,omitempty"`   // runs
	Baseline string   `json:"baseline,omitempty"` // compare; regression: pinned baseline runs, comma-separated

	Metrics  []string `json:"metrics,omitempty"`  // series: loss, lr, metrics.NAME, …; gpus: util_pct, …
	Rank     string   `json:"rank,omitempty"`     // "0", "3", "all"; default "0"
	XAxis    string   `json:"xAxis,omitempty"`    // series: "time" (default) or "step"
	MinMax   bool     `json:"minMax,omitempty"`   // series: add min and max fields
	WithStep bool     `json:"withStep,omitempty"` // series on time: add the step as a field shown in tooltips only
	FromStep *int64   `json:"fromStep,omitempty"`
	ToStep   *int64   `json:"toStep,omitempty"`

	Pass     string `json:"pass,omitempty"`     // heatmap: forward (default) or backward
	MaxSteps int    `json:"maxSteps,omitempty"` // heatmap: columns

	Host string `json:"host,omitempty"` // gpus
	GPU  string `json:"gpu,omitempty"`  // gpus: index or "" for all

	StragglerPct float64 `json:"stragglerPct,omitempty"` // ranks
	// Part picks what a ranks query answers: "" the per-rank table,
	// PartHosts the ranks rolled up by host, the slowest host first,
	// PartBars the rows of a bar chart of the figure Metrics[0].
	Part string `json:"part,omitempty"`

	// Format "numeric" answers run_summary, ranks and alerts as one
	// numeric-wide frame (each figure a number field labelled run_id, and
	// rank and host for ranks, kind and subject for alerts), which Grafana
	// alert rules accept; "table" answers gpus
	// as one row per GPU; "" is each query's usual frames.
	Format string `json:"format,omitempty"`

	EventTypes []string `json:"eventTypes,omitempty"` // annotations: checkpoint, overflow, restart, eval, …; none: all

	AlertKind string `json:"alertKind,omitempty"` // alerts: one kind (non_finite, idle_gpu, …); none: all

	// Jobs, job_counts, quotas and sweep_trials filter by Project and
	// Sweep; "*" (a picker's All) or "" is no filter.
	State  string `json:"state,omitempty"`  // jobs, job_counts: queued, running, finished, failed, cancelled, lost
	Metric string `json:"metric,omitempty"` // sweep_trials: the eval metric trials are ranked by (val_accuracy, val_loss, …)
	Goal   string `json:"goal,omitempty"`   // sweep_trials: min or max; none: the sweep's own, or min for a loss
}

// Query types of [PluginQuery].
const (
	QueryRuns        = "runs"         // table of runs
	QueryRunSummary  = "run_summary"  // one-row frame of the summary cards
	QueryRunDetails  = "run_details"  // key/value table: config, params, command, commit, versions
	QueryRunCode     = "run_code"     // the entry script and the git diff, one row per line
	QuerySeries      = "series"       // time series (or step on x)
	QueryHeatmap     = "heatmap"      // heatmap-rows frame
	QueryEvals       = "evals"        // evaluation points
	QueryBreakdown   = "breakdown"    // donut
	QueryMemory      = "memory"       // ZeRO bars
	QueryCompare     = "compare"      // comparison table
	QueryRanks       = "ranks"        // per-rank table
	QueryGPUs        = "gpus"         // GPU telemetry per host and GPU
	QueryAnnotations = "annotations"  // run events
	QueryAlerts      = "alerts"       // the server detectors' open alerts
	QueryHangReports = "hang_reports" // table: each rank's newest hang report of a run
	QueryConsistency = "consistency"  // table: the invariants a run's records break, a sentence each
	QueryRegression  = "regression"   // tables: what changed against the run's baseline runs, the sentence first
	QueryLedger      = "ledger"       // table: lost GPU-hours by cause, a column per run (runs) or per day (project)
	QueryJobs        = "jobs"         // table of jobs
	QueryJobCounts   = "job_counts"   // numeric-wide: total, active, done, failed, …
	QueryQuotas      = "quotas"       // numeric-wide: GPU-hours used per project, its limit as max
	QuerySweepTrials = "sweep_trials" // table: a sweep's trials, params as columns, best first
)

// Parts of a ranks query ([PluginQuery.Part]).
const (
	PartRanks = ""      // one row per rank
	PartHosts = "hosts" // one row per host, the slowest first
	// PartBars is one row per rank up to MaxRankBars ranks, the largest
	// figure first; past that, MaxRankBars rows: the flagged ranks and the
	// others evenly in the order of the figure, from the largest to the
	// smallest, so the bars read as the ranks' distribution.
	PartBars = "bars"
)

// MaxRankBars is the most bars a per-rank bar chart draws.
const MaxRankBars = 48

// The quantiles of a series query's distribution frame: with rank=all on
// a run of more than MaxRankSeries ranks, each metric comes back as one
// frame whose fields are the metric's distribution over the ranks, one for
// each q of SpreadQuantiles (SpreadLabel names them in words).
const (
	SpreadMin    = "min"
	SpreadP5     = "p5"
	SpreadMedian = "median"
	SpreadP95    = "p95"
	SpreadMax    = "max"
)

// SpreadQuantiles lists the distribution's fields, lowest first.
var SpreadQuantiles = []string{SpreadMin, SpreadP5, SpreadMedian, SpreadP95, SpreadMax}

// BaselineFirst as the baseline of /compare is the first of the runs
// compared: within a sweep, its first trial.
const BaselineFirst = "@first"

// AllValue is the value of a picker's "All" (the jobs dashboard's, the GPU
// nodes dashboard's run picker): no filter.
const AllValue = "*"

// PluginQueryTypes lists every query type.
var PluginQueryTypes = []string{QueryRuns, QueryRunSummary, QueryRunDetails, QueryRunCode, QuerySeries, QueryHeatmap, QueryEvals,
	QueryBreakdown, QueryMemory, QueryCompare, QueryRanks, QueryGPUs, QueryAnnotations, QueryAlerts,
	QueryJobs, QueryJobCounts, QueryQuotas, QuerySweepTrials, QueryHangReports, QueryConsistency,
	QueryRegression, QueryLedger}
