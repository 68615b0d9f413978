package api

import "time"

// Alert kinds: what a server detector found (package alerts documents
// each one's rule and defaults).
const (
	AlertNonFinite     = "non_finite"
	AlertOverflowStorm = "overflow_storm"
	AlertLossSpike     = "loss_spike"
	AlertIdleGPU       = "idle_gpu"
	AlertStalled       = "stalled"
	AlertRankStopped   = "rank_stopped"
	AlertDataStall     = "data_stall"
	AlertStraggler     = "straggler"
	AlertHang          = "hang"
	AlertRegression    = "regression"
	AlertDrift         = "drift"
)

// EventHang is the type of the hook's hang report (hook/deepseed/hang.py:
// its text is JSON: reason, rank, host, step, the last collective, every
// thread's stack); EventHangGPUs that of the snapshot of the host's GPUs
// the collector sends beside it.
const (
	EventHang     = "hang"
	EventHangGPUs = "hang_gpus"
)

// AlertKinds lists every alert kind.
var AlertKinds = []string{AlertNonFinite, AlertOverflowStorm, AlertLossSpike, AlertIdleGPU,
	AlertStalled, AlertRankStopped, AlertDataStall, AlertStraggler, AlertHang, AlertRegression, AlertDrift}

// Alert is one firing of a detector on a run: open while its condition
// holds (ResolvedAt null), resolved when it clears.
type Alert struct {
	ID         int64      `json:"id"`
	RunID      string     `json:"run_id"`
	Project    string     `json:"project"`
	Kind       string     `json:"kind"`
	Subject    string     `json:"subject"` // "" for the whole run, "rank 2", "host/gpu 3"
	Rank       *int       `json:"rank"`
	Step       *int64     `json:"step"`
	Value      *Float     `json:"value"`
	Threshold  *Float     `json:"threshold"`
	Text       string     `json:"text"`
	At         time.Time  `json:"at"` // time of the data that fired
	OpenedAt   time.Time  `json:"opened_at"`
	ResolvedAt *time.Time `json:"resolved_at"`
	State      string     `json:"state"` // "open" or "resolved"
}

// AlertList answers GET /api/v1/alerts, the newest first.
type AlertList struct {
	Alerts []Alert `json:"alerts"`
	Limit  int     `json:"limit"`
}
