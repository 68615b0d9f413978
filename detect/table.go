package detect

import "github.com/deepseed/deepseed/api"

// Severity is the severity label of a detector's Grafana alert rule.
type Severity string

// The severities the rules use.
const (
	Critical Severity = "critical"
	Warning  Severity = "warning"
)

// Detector is one detector: the kind of alert it opens, the pure function
// that finds them in a run's rows, the thresholds it reads and what its
// Grafana alert rule says.
type Detector struct {
	// Kind is the kind of the alerts it opens (api.Alert…). The Grafana
	// rule's uid is "deepseed-" and the kind with dashes.
	Kind string
	// Title names what it finds; the Grafana rule is "DeepSeed: " + Title.
	Title    string
	Severity Severity
	// Thresholds are the Config fields it reads, by their JSON names:
	// what a run's meta may override for it.
	Thresholds []string
	// Detect returns what fires in one run's rows.
	Detect func(cfg Config, in Rows) []Firing
	// Summary and Description are the Grafana rule's annotations (Grafana
	// templates: {{ $labels.run_id }}, {{ $labels.subject }}); empty ones
	// say "<Title> on run <run> <subject>" and where the API has the
	// alert's text, value and threshold.
	Summary, Description string
}

// Table lists every detector, in the order a pass runs them and Grafana
// lists their rules.
var Table = []Detector{
	{Kind: api.AlertNonFinite, Title: "non-finite loss or grad norm", Severity: Critical,
		Thresholds: []string{"non_finite_steps"}, Detect: nonFinite},
	{Kind: api.AlertOverflowStorm, Title: "fp16 overflow storm", Severity: Critical,
		Thresholds: []string{"window", "skipped_pct", "min_loss_scale"}, Detect: overflowStorm},
	{Kind: api.AlertLossSpike, Title: "loss spike", Severity: Warning,
		Thresholds: []string{"spike_z", "spike_window"}, Detect: lossSpike},
	{Kind: api.AlertDataStall, Title: "data stall", Severity: Warning,
		Thresholds: []string{"window", "data_share_pct"}, Detect: dataStall},
	{Kind: api.AlertStalled, Title: "stalled run", Severity: Critical,
		Thresholds: []string{"window", "stall_min", "stall_steps"}, Detect: stalled},
	{Kind: api.AlertRankStopped, Title: "rank stopped", Severity: Critical,
		Thresholds: []string{"window", "stall_min", "stall_steps"}, Detect: rankStopped},
	{Kind: api.AlertStraggler, Title: "straggling rank", Severity: Warning,
		Thresholds: []string{"window", "straggler_pct", "straggler_alpha"}, Detect: straggler},
	{Kind: api.AlertHang, Title: "hung run", Severity: Critical, Detect: hang,
		Summary: "hung run {{ $labels.run_id }}",
		Description: "The DeepSeed server opened a hang alert: a rank's steps stopped and its hook sent where every thread is. " +
			"GET /api/v1/alerts?run_id={{ $labels.run_id }}&kind=hang names the rank that stopped first; " +
			"the run's hang events (GET /api/v1/annotations) hold the stacks."},
	{Kind: api.AlertIdleGPU, Title: "idle GPU", Severity: Warning,
		Thresholds: []string{"idle_util_pct", "idle_for"}, Detect: idleGPU},
	{Kind: api.AlertRegression, Title: "regression against the baseline", Severity: Warning,
		Thresholds: []string{"regression_pct", "regression_z", "layer_pct"}, Detect: regression,
		Description: "The DeepSeed server compared the run with the comparable runs of its project and found it worse beyond their spread. " +
			"GET /api/v1/runs/{{ $labels.run_id }}/regression says where and what differs."},
	{Kind: api.AlertDrift, Title: "throughput drift", Severity: Warning,
		Thresholds: []string{"drift_pct", "drift_for"}, Detect: drift},
}

// Run runs every detector of Table over one run's rows and returns what
// fires, in the table's order.
func Run(cfg Config, in Rows) []Firing {
	var out []Firing
	for _, d := range Table {
		out = append(out, d.Detect(cfg, in)...)
	}
	return out
}
