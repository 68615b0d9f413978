package detect

import (
	"encoding/json"
	"time"
)

// Config holds the detectors' thresholds. Defaults returns the
// documented defaults; a run overrides any of them in its meta under the
// "alerts" key, e.g. {"alerts": {"idle_util_pct": 5, "stall_min": "10m"}}.
type Config struct {
	// Window is how many of each rank's newest steps the step detectors
	// read (non-finite, overflow storm, data stall, straggler).
	Window int `json:"window"`
	// NonFiniteSteps: a non-finite loss or grad norm in any rank's newest
	// NonFiniteSteps steps keeps the alert open.
	NonFiniteSteps int `json:"non_finite_steps"`
	// SkippedPct: an overflow storm is more than SkippedPct % of the last
	// Window steps skipped, or the loss scale at or below MinLossScale.
	SkippedPct   float64 `json:"skipped_pct"`
	MinLossScale float64 `json:"min_loss_scale"`
	// SpikeZ: a loss spike is a newest loss whose robust z-score
	// (0.6745 · (x − median) / MAD) over the SpikeWindow steps before it
	// is above SpikeZ.
	SpikeZ      float64 `json:"spike_z"`
	SpikeWindow int     `json:"spike_window"`
	// IdleUtilPct, IdleFor: an idle GPU is one attributed to a running run
	// below IdleUtilPct % utilisation for IdleFor of sample time.
	IdleUtilPct float64  `json:"idle_util_pct"`
	IdleFor     Duration `json:"idle_for"`
	// StallMin, StallSteps: a running run is stalled when no step came for
	// max(StallMin, StallSteps × its median step time) of server time; a
	// rank has stopped when its newest step is that much older than the
	// run's newest.
	StallMin   Duration `json:"stall_min"`
	StallSteps float64  `json:"stall_steps"`
	// DataSharePct: a data stall is a rank whose data_ms is above
	// DataSharePct % of its step_ms, summed over the last Window steps.
	DataSharePct float64 `json:"data_share_pct"`
	// StragglerPct, StragglerAlpha: a straggler is a rank whose straggler
	// score — an EWMA with weight StragglerAlpha on the newest step of its
	// lateness at the synchronisation point over the step's median busy
	// time (docs/ranks.md) — is above StragglerPct %.
	StragglerPct   float64 `json:"straggler_pct"`
	StragglerAlpha float64 `json:"straggler_alpha"`
	// RegressionPct, RegressionZ: a figure of a run (step time,
	// throughput, MFU, peak memory) regressed when it is worse than its
	// baseline's mean by more than max(RegressionZ × the baseline's
	// spread, RegressionPct %) (docs/regression.md); LayerPct is the
	// floor for a layer or a phase to be named.
	RegressionPct float64 `json:"regression_pct"`
	RegressionZ   float64 `json:"regression_z"`
	LayerPct      float64 `json:"layer_pct"`
	// DriftPct, DriftFor: a run drifts when its throughput stays
	// DriftPct % or more below its own steady window for DriftFor.
	DriftPct float64  `json:"drift_pct"`
	DriftFor Duration `json:"drift_for"`
}

// The defaults a regression's sentence quotes.
const (
	RegressionZDefault = 3.0
	LayerPctDefault    = 5.0
)

// Defaults returns the documented defaults.
func Defaults() Config {
	return Config{
		Window:         50,
		NonFiniteSteps: 10,
		SkippedPct:     20,
		MinLossScale:   1,
		SpikeZ:         8,
		SpikeWindow:    100,
		IdleUtilPct:    10,
		IdleFor:        Duration(2 * time.Minute),
		StallMin:       Duration(5 * time.Minute),
		StallSteps:     10,
		DataSharePct:   30,
		StragglerPct:   10,
		StragglerAlpha: 0.1,
		RegressionPct:  3,
		RegressionZ:    RegressionZDefault,
		LayerPct:       LayerPctDefault,
		DriftPct:       5,
		DriftFor:       Duration(3 * time.Minute),
	}
}

// WithMeta returns c overridden by the "alerts" object of a run's meta;
// a malformed override is ignored (the defaults stay), never an error.
func (c Config) WithMeta(meta []byte) Config {
	if len(meta) == 0 {
		return c
	}
	var m struct {
		Alerts json.RawMessage `json:"alerts"`
	}
	if json.Unmarshal(meta, &m) != nil || len(m.Alerts) == 0 {
		return c
	}
	o := c
	if json.Unmarshal(m.Alerts, &o) != nil {
		return c
	}
	if o.Window < 2 || o.Window > 1000 {
		o.Window = c.Window
	}
	if o.SpikeWindow < 10 || o.SpikeWindow > 1000 {
		o.SpikeWindow = c.SpikeWindow
	}
	if !(o.StragglerAlpha > 0 && o.StragglerAlpha <= 1) {
		o.StragglerAlpha = c.StragglerAlpha
	}
	if o.NonFiniteSteps < 1 {
		o.NonFiniteSteps = c.NonFiniteSteps
	}
	return o
}

// Duration is a time.Duration that reads from JSON as "2m" or seconds.
type Duration time.Duration

// UnmarshalJSON accepts a Go duration string or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		*d = Duration(v)
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*d = Duration(time.Duration(f * float64(time.Second)))
	return nil
}

// MarshalJSON writes the duration as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }
