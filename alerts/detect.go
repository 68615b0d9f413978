package alerts

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/stats"
)

// stepRow is one step of one rank as the detectors read it; the columns
// a record left out are NaN (loss, grad norm, times) or false.
type stepRow struct {
	Rank       int
	Step       int64
	Time       time.Time
	Loss       *float64
	GradNorm   *float64
	LossScale  *float64
	Skipped    bool
	StepMS     *float64
	DataMS     *float64
	SyncNS     *int64
	SyncWaitMS *float64
}

// gpuState is a GPU's recent samples as the idle detector reads them.
type gpuState struct {
	Host      string
	GPU       int
	Rank      *int
	Last      time.Time // newest sample
	IdleSince time.Time // the oldest sample after the last busy one
	LastUtil  float64
}

// firing is one detector's finding; (Kind, Subject) keys it in a run.
type firing struct {
	Kind      string
	Subject   string
	Rank      *int
	Step      *int64
	Value     float64
	Threshold float64
	Text      string
	At        time.Time
}

func rankSubject(r int) string { return fmt.Sprintf("rank %d", r) }

func finite(p *float64) bool { return p == nil || (!math.IsNaN(*p) && !math.IsInf(*p, 0)) }

// detectSteps runs the step detectors over each rank's newest steps,
// newest first. running says whether the run is still running (stall
// detectors apply only then); now is the server's clock.
func detectSteps(cfg Config, byRank map[int][]stepRow, running bool, now time.Time) []firing {
	var out []firing
	ranks := make([]int, 0, len(byRank))
	for r := range byRank {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	if len(ranks) == 0 {
		return nil
	}

	// Non-finite loss or grad norm, any rank: one alert per run while one
	// of the newest steps has one, naming where that streak began — the
	// oldest non-finite step read that is not followed by NonFiniteSteps
	// finite ones — so a batch of many steps at once (an import, a
	// collector catching up) names the step the loss first went bad.
	var nf *stepRow
	bad := func(s stepRow) bool { return !finite(s.Loss) || !finite(s.GradNorm) }
	for _, r := range ranks {
		rows := byRank[r]
		if !slices.ContainsFunc(rows[:min(len(rows), cfg.NonFiniteSteps)], bad) {
			continue
		}
		first, gap := -1, 0
		for i := range rows {
			if bad(rows[i]) {
				first, gap = i, 0
			} else if gap++; gap >= cfg.NonFiniteSteps {
				break
			}
		}
		if nf == nil || rows[first].Step < nf.Step {
			nf = &rows[first]
		}
	}
	if nf != nil {
		what, v := "loss", nf.Loss
		if finite(nf.Loss) {
			what, v = "grad norm", nf.GradNorm
		}
		rank, step := nf.Rank, nf.Step
		out = append(out, firing{Kind: api.AlertNonFinite, Rank: &rank, Step: &step, Value: *v,
			Text: fmt.Sprintf("non-finite %s (%v) at step %d on rank %d", what, *v, step, rank), At: nf.Time})
	}

	// Overflow storm and loss spike read the lowest rank: every data
	// parallel rank skips the same steps and sees the same loss.
	lead := byRank[ranks[0]]
	n := min(len(lead), cfg.Window)
	if n >= 10 {
		skipped := 0
		for _, s := range lead[:n] {
			if s.Skipped {
				skipped++
			}
		}
		pct := 100 * float64(skipped) / float64(n)
		if pct > cfg.SkippedPct {
			step := lead[0].Step
			out = append(out, firing{Kind: api.AlertOverflowStorm, Step: &step, Value: pct, Threshold: cfg.SkippedPct,
				Text: fmt.Sprintf("overflow storm: %d of the last %d steps skipped (%.0f %% > %g %%)", skipped, n, pct, cfg.SkippedPct),
				At:   lead[0].Time})
		} else if ls := lead[0].LossScale; ls != nil && *ls <= cfg.MinLossScale {
			step := lead[0].Step
			out = append(out, firing{Kind: api.AlertOverflowStorm, Step: &step, Value: *ls, Threshold: cfg.MinLossScale,
				Text: fmt.Sprintf("loss scale at its floor (%g <= %g)", *ls, cfg.MinLossScale), At: lead[0].Time})
		}
	}
	if f, ok := lossSpike(cfg, lead); ok {
		out = append(out, f)
	}

	// Data stall, per rank (the straggler comes from lateness: detectStragglers).
	meds := make(map[int]float64, len(ranks))
	for _, r := range ranks {
		rows := byRank[r][:min(len(byRank[r]), cfg.Window)]
		var data, step float64
		var sts []float64
		for _, s := range rows {
			if s.StepMS != nil && !math.IsNaN(*s.StepMS) {
				sts = append(sts, *s.StepMS)
				if s.DataMS != nil && !math.IsNaN(*s.DataMS) {
					data += *s.DataMS
					step += *s.StepMS
				}
			}
		}
		if len(sts) > 0 {
			meds[r] = stats.Median(sts)
		}
		if len(rows) >= 10 && step > 0 {
			if pct := 100 * data / step; pct > cfg.DataSharePct {
				rank, st := r, rows[0].Step
				out = append(out, firing{Kind: api.AlertDataStall, Subject: rankSubject(r), Rank: &rank, Step: &st,
					Value: pct, Threshold: cfg.DataSharePct, At: rows[0].Time,
					Text: fmt.Sprintf("data stall on rank %d: %.0f %% of step time getting batches (> %g %%)", r, pct, cfg.DataSharePct)})
			}
		}
	}
	if !running {
		return out
	}
	// Stalled run, stopped rank: absence, by the server's clock for the
	// run and by the step times for a rank against its peers.
	var newest time.Time
	var all []float64
	for _, r := range ranks {
		if t := byRank[r][0].Time; t.After(newest) {
			newest = t
		}
		if m, ok := meds[r]; ok {
			all = append(all, m)
		}
	}
	limit := time.Duration(cfg.StallMin)
	if len(all) > 0 {
		limit = max(limit, time.Duration(cfg.StallSteps*stats.Median(all)*float64(time.Millisecond)))
	}
	if quiet := now.Sub(newest); quiet > limit {
		out = append(out, firing{Kind: api.AlertStalled, Value: quiet.Seconds(), Threshold: limit.Seconds(), At: newest,
			Text: fmt.Sprintf("no step for %s (limit %s)", quiet.Round(time.Second), limit.Round(time.Second))})
	}
	for _, r := range ranks {
		last := byRank[r][0]
		if behind := newest.Sub(last.Time); behind > limit {
			rank, st := r, last.Step
			out = append(out, firing{Kind: api.AlertRankStopped, Subject: rankSubject(r), Rank: &rank, Step: &st,
				Value: behind.Seconds(), Threshold: limit.Seconds(), At: last.Time,
				Text: fmt.Sprintf("rank %d stopped at step %d, %s before the other ranks' newest step", r, st, behind.Round(time.Second))})
		}
	}
	return out
}

// lossSpike scores the newest loss against the SpikeWindow losses before it.
func lossSpike(cfg Config, rows []stepRow) (firing, bool) {
	if len(rows) < 20 || rows[0].Loss == nil || !finite(rows[0].Loss) {
		return firing{}, false
	}
	var prev []float64
	for _, s := range rows[1:min(len(rows), cfg.SpikeWindow+1)] {
		if s.Loss != nil && finite(s.Loss) {
			prev = append(prev, *s.Loss)
		}
	}
	if len(prev) < 19 {
		return firing{}, false
	}
	med := stats.Median(prev)
	dev := make([]float64, len(prev))
	for i, v := range prev {
		dev[i] = math.Abs(v - med)
	}
	mad := stats.Median(dev)
	if mad <= 0 {
		return firing{}, false
	}
	z := 0.6745 * (*rows[0].Loss - med) / mad
	if z <= cfg.SpikeZ {
		return firing{}, false
	}
	step := rows[0].Step
	return firing{Kind: api.AlertLossSpike, Step: &step, Value: z, Threshold: cfg.SpikeZ, At: rows[0].Time,
		Text: fmt.Sprintf("loss spike at step %d: %g, robust z-score %.1f > %g", step, *rows[0].Loss, z, cfg.SpikeZ)}, true
}

// detectStragglers fires for each rank whose newest straggler score is
// above StragglerPct % once at least minScored steps were scored: the
// rank that makes the others wait at the synchronisation point.
func detectStragglers(cfg Config, newest map[int]rankScore, scored int) []firing {
	if scored < minScored {
		return nil
	}
	ranks := make([]int, 0, len(newest))
	for r := range newest {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	var out []firing
	for _, r := range ranks {
		s := newest[r]
		pct := 100 * s.Score
		if pct <= cfg.StragglerPct {
			continue
		}
		rank, st := r, s.Step
		out = append(out, firing{Kind: api.AlertStraggler, Subject: rankSubject(r), Rank: &rank, Step: &st,
			Value: pct, Threshold: cfg.StragglerPct, At: s.Time,
			Text: fmt.Sprintf("straggler: rank %d arrives at the synchronisation point late by %.0f %% of the ranks' median busy time (EWMA; %.1f ms at step %d) and the other ranks wait for it",
				r, pct, s.Late, st)})
	}
	return out
}

// minScored is how many steps must be scored before a straggler fires.
const minScored = 10

// detectIdle fires for each GPU below the utilisation threshold for the
// idle span of sample time.
func detectIdle(cfg Config, gpus []gpuState) []firing {
	var out []firing
	for _, g := range gpus {
		idle := g.Last.Sub(g.IdleSince)
		if g.LastUtil >= cfg.IdleUtilPct || idle < time.Duration(cfg.IdleFor) {
			continue
		}
		out = append(out, firing{Kind: api.AlertIdleGPU, Subject: fmt.Sprintf("%s/gpu %d", g.Host, g.GPU), Rank: g.Rank,
			Value: g.LastUtil, Threshold: cfg.IdleUtilPct, At: g.IdleSince,
			Text: fmt.Sprintf("GPU %d of %s below %g %% utilisation for %s", g.GPU, g.Host, cfg.IdleUtilPct, idle.Round(time.Second))})
	}
	return out
}
