package detect

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/stats"
)

// StepBlock is one block of a rank's steps (a rollup bucket): when its
// first and last steps came and their mean step time.
type StepBlock struct {
	FirstStep           int64
	FirstTime, LastTime time.Time
	StepMS              float64
}

// DriftInput is what the drift detector reads of a running run: its
// lowest rank's step blocks from the steady state on, oldest first, and
// the run's GPU samples over its reference window and its newest blocks.
type DriftInput struct {
	Blocks      []StepBlock
	Ref, Recent GPUWindow
}

// Drift is a run slower than its own steady window.
type Drift struct {
	// RefSPS and NowSPS are steps per second in the reference window (the
	// median of the first DriftRefBlocks steady blocks) and over the
	// drifting blocks; From is when the drift began.
	RefSPS, NowSPS, DropPct float64
	From, To                time.Time
	Cause, Text             string
}

// DriftRefBlocks is how many steady blocks make a run's reference window.
const DriftRefBlocks = 10

// DriftWindow splits a run's blocks into its reference window (the first
// DriftRefBlocks, or all but the newest third when it has fewer) and the
// newest blocks after it.
func DriftWindow(blocks []StepBlock) (ref, rest []StepBlock) {
	n := min(DriftRefBlocks, len(blocks)*2/3)
	return blocks[:n], blocks[n:]
}

// DriftOf returns the drift of a run, nil when none: the newest blocks
// whose throughput is DriftPct % or more below the reference's, together
// spanning at least DriftFor. The cause is throttling (thermal, power,
// hardware slowdown) when the recent samples show it past
// ThrottledPctFloor % above the reference's share, a clock drop past
// RegressionClockPct %, or the host whose clock fell most.
func DriftOf(cfg Config, in DriftInput) *Drift {
	ref, rest := DriftWindow(in.Blocks)
	if len(ref) < 2 || len(rest) == 0 {
		return nil
	}
	var rates []float64
	for _, b := range ref {
		if b.StepMS > 0 {
			rates = append(rates, 1000/b.StepMS)
		}
	}
	refSPS := stats.Median(rates)
	if !(refSPS > 0) {
		return nil
	}
	limit := refSPS * (1 - cfg.DriftPct/100)
	i := len(rest)
	for i > 0 && rest[i-1].StepMS > 0 && 1000/rest[i-1].StepMS <= limit {
		i--
	}
	slow := rest[i:]
	if len(slow) == 0 {
		return nil
	}
	from, to := slow[0].FirstTime, slow[len(slow)-1].LastTime
	if to.Sub(from) < time.Duration(cfg.DriftFor) {
		return nil
	}
	var ms float64
	for _, b := range slow {
		ms += b.StepMS
	}
	now := 1000 / (ms / float64(len(slow)))
	d := &Drift{RefSPS: refSPS, NowSPS: now, DropPct: (1 - now/refSPS) * 100, From: from, To: to}
	d.Cause, d.Text = driftCause(in.Ref, in.Recent)
	text := fmt.Sprintf("throughput %.1f %% below its own steady window (%.3g → %.3g steps/s) for %s",
		d.DropPct, refSPS, now, to.Sub(from).Round(time.Second))
	if d.Text != "" {
		text += ": " + d.Text
	}
	d.Text = text
	return d
}

func driftCause(ref, recent GPUWindow) (string, string) {
	if recent.Samples == 0 {
		return "", ""
	}
	if recent.ThrottlePct >= ThrottledPctFloor && recent.ThrottlePct > ref.ThrottlePct+ThrottledPctFloor {
		cause := "throttling"
		if len(recent.Reasons) > 0 {
			cause = strings.Join(recent.Reasons, "+") + "_throttling"
		}
		return cause, fmt.Sprintf("%s throttling in %.0f %% of samples (was %.0f %%) on %s",
			strings.Join(recent.Reasons, "+"), recent.ThrottlePct, ref.ThrottlePct, strings.Join(recent.Throttled, ", "))
	}
	var worst string
	drop := 0.0
	for _, h := range slices.Sorted(maps.Keys(recent.Hosts)) {
		if r, ok := ref.Hosts[h]; ok && r > 0 {
			if x := (1 - recent.Hosts[h]/r) * 100; x > drop {
				worst, drop = h, x
			}
		}
	}
	if drop > RegressionClockPct {
		if len(recent.Hosts) > 1 {
			return "slow_host", fmt.Sprintf("host %s's SM clock fell %.0f %%", worst, drop)
		}
		return "clock_change", fmt.Sprintf("the SM clock fell %.0f %% on %s", drop, worst)
	}
	return "", ""
}

// drift fires while a running run drifts (Rows.Drift).
func drift(cfg Config, in Rows) []Firing {
	if !in.Running || in.Drift == nil {
		return nil
	}
	d := DriftOf(cfg, *in.Drift)
	if d == nil {
		return nil
	}
	subject := ""
	if d.Cause != "" {
		subject = d.Cause
	}
	return []Firing{{Kind: api.AlertDrift, Subject: subject, Value: d.DropPct, Threshold: cfg.DriftPct, Text: d.Text, At: d.From}}
}
