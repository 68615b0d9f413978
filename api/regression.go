package api

// Regression answers GET /api/v1/runs/{id}/regression: how the run's
// steady state compares with the comparable runs of its project
// (docs/regression.md): the figures beyond the baseline's own spread,
// where the difference is and what differs between the runs.
type Regression struct {
	RunID       string      `json:"run_id"`
	Fingerprint Fingerprint `json:"fingerprint"`
	// Basis says how the baseline was chosen: "fingerprint" (the newest
	// comparable runs), "tag" (the comparable runs carrying the tag) or
	// "run" (runs pinned with baseline=).
	Basis string `json:"basis"`
	// Baseline lists the baseline runs, newest first (at most
	// RegressionMaxBaseline).
	Baseline []string `json:"baseline"`
	// Regressed is true when a figure is worse than the baseline beyond
	// its spread; Sentence says what, where and why in one line.
	Regressed bool     `json:"regressed"`
	Sentence  string   `json:"sentence"`
	Figures   []Figure `json:"figures"`
	// Phases and Layers are where the step time moved: each phase's and
	// each layer's change of its mean time (layers: the lowest rank's
	// forward and backward, from the layer rollups), largest first, only
	// those beyond the threshold.
	Phases []PlaceDelta `json:"phases"`
	Layers []PlaceDelta `json:"layers"`
	// Ranks are the ranks whose own work (forward + backward + optimizer)
	// grew clearly more than the run's median rank's; Hosts their hosts.
	Ranks []PlaceDelta `json:"ranks"`
	Hosts []string     `json:"hosts"`
	// Differs lists what differs from the baseline: git commit and diff,
	// config keys, library versions, hosts, GPU clocks and throttling.
	Differs []Difference `json:"differs"`
	// Cause names the most likely cause when one difference explains the
	// change ("throttling", "layer", "phase", "host", …), "" otherwise.
	Cause string `json:"cause"`
	Note  string `json:"note,omitempty"`
}

// RegressionMaxBaseline bounds the baseline runs a regression reads.
const RegressionMaxBaseline = 8

// Fingerprint is what makes two runs comparable: the same model and
// parameter count, world size, precision, parallelism and micro batch.
type Fingerprint struct {
	Model       string `json:"model"`
	Params      *int64 `json:"params"`
	WorldSize   *int   `json:"world_size"`
	Precision   string `json:"precision"`
	Parallelism string `json:"parallelism"`
	MicroBatch  *int   `json:"micro_batch"`
}

// Figure is one steady-state figure against the baseline: the run's
// value, the baseline runs' mean and spread (their standard deviation;
// 0 for one run), how many baseline runs had it, the change in per cent
// and the threshold it was held to (max(3 × spread, floor) in per cent
// of the mean). Beyond is true when |delta| passes the threshold, Worse
// when it does so in the direction that costs (slower, less throughput,
// less MFU, more memory).
type Figure struct {
	Name         string `json:"name"`
	Unit         string `json:"unit"`
	Value        *Float `json:"value"`
	BaselineMean *Float `json:"baseline_mean"`
	Spread       *Float `json:"spread"`
	N            int    `json:"n"`
	DeltaPct     *Float `json:"delta_pct"`
	ThresholdPct *Float `json:"threshold_pct"`
	Beyond       bool   `json:"beyond"`
	Worse        bool   `json:"worse"`
}

// PlaceDelta is where a change is: a phase, a layer or a rank, its value
// in the run and in the baseline (means, ms) and the change.
type PlaceDelta struct {
	Name     string `json:"name"`
	Value    Float  `json:"value_ms"`
	Baseline Float  `json:"baseline_ms"`
	DeltaMS  Float  `json:"delta_ms"`
	DeltaPct Float  `json:"delta_pct"`
}

// Difference is one thing that differs from the baseline: What is
// git_commit, git_diff, config, version, hosts, gpu_clock or throttle;
// Key the config key or library; Value the run's and Baseline the
// baseline's (the values of its runs, joined by ", ").
type Difference struct {
	What     string `json:"what"`
	Key      string `json:"key,omitempty"`
	Value    string `json:"value"`
	Baseline string `json:"baseline"`
}

// Ledger answers GET /api/v1/runs/{id}/ledger: the run's GPU-hours and
// those lost, by cause (docs/ledger.md). The items never sum past
// GPUHours: each is taken from what the ones before it left.
type Ledger struct {
	RunID     string `json:"run_id"`
	Project   string `json:"project"`
	StartedAt *Time  `json:"started_at"`
	// GPUHours is ranks × the run's wall time (first step to last, or to
	// now while it runs).
	GPUHours Float        `json:"gpu_hours"`
	LostGPUH Float        `json:"lost_gpu_h"`
	Items    []LedgerItem `json:"items"`
}

// LedgerItem is the GPU-hours lost to one cause and how they were
// computed.
type LedgerItem struct {
	Cause string `json:"cause"`
	GPUH  Float  `json:"gpu_h"`
	How   string `json:"how"`
}

// The ledger's causes.
const (
	LostStragglerData = "straggler_data"
	LostStragglerHost = "straggler_host"
	LostStragglerGPU  = "straggler_gpu"
	LostStragglerComm = "straggler_comm"
	LostStalled       = "stalled"
	LostIdle          = "idle"
	LostSkipped       = "skipped"
	LostThrottling    = "throttling"
	LostRegression    = "regression"
	LostRestarts      = "restarts"
)

// LedgerCauses lists the causes in the order a ledger takes them.
var LedgerCauses = []string{LostRestarts, LostStalled, LostIdle, LostSkipped, LostStragglerData, LostStragglerHost,
	LostStragglerGPU, LostStragglerComm, LostThrottling, LostRegression}

// EventResume is the type of the event a resumed run sends (its step the
// checkpoint's step it resumed from): the ledger counts the time from
// that step to the next as lost to the restart.
const EventResume = "resume"

// ProjectLedger answers GET /api/v1/ledger?project=…: the ledgers of the
// project's newest runs (at most limit) and their sums by cause and by
// day of the runs' start.
type ProjectLedger struct {
	Project  string           `json:"project"`
	GPUHours Float            `json:"gpu_hours"`
	LostGPUH Float            `json:"lost_gpu_h"`
	ByCause  map[string]Float `json:"by_cause"`
	Days     []LedgerDay      `json:"days"`
	Runs     []Ledger         `json:"runs"`
}

// LedgerDay is one day's (UTC) sums of a project ledger.
type LedgerDay struct {
	Day      string           `json:"day"`
	GPUHours Float            `json:"gpu_hours"`
	ByCause  map[string]Float `json:"by_cause"`
}
