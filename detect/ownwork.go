package detect

import (
	"maps"
	"math"
	"slices"

	"github.com/deepseed/deepseed/internal/stats"
)

// Own work: the second straggler signal, beside lateness (docs/ranks.md).
//
// Lateness needs to see the collective: where collectives block the host
// (gloo, and some DDP and FSDP internals), every rank arrives at the
// end-of-backward all-reduce together, because the healthy ranks have
// already waited for the slow one inside an earlier phase (a forward
// that broadcasts buffers, an FSDP all-gather), and their forward reads
// as long as the slow rank's own delay. What still tells them apart is
// where each rank's excess over the others lies. Every step that every
// rank reported is split, per rank, into
//
//	data = data_ms                          (waiting for its own input)
//	host = step − data − forward − backward − optimizer − waits − input wait
//	                                        (its host's own work between the phases)
//	gpu  = forward + backward + optimizer   (device work, and where host-blocking waits hide)
//
// where waits is the larger of sync_wait_ms and comm_exposed_ms (the
// waits the hook measured). Data and host time cannot hold a wait for a
// peer (the hook moves a blocked input copy into input_wait_ms), so a
// rank's excess there over the median of the other ranks is its own; the
// largest such excess of the step is what every other rank may have had
// to wait, so a rank's gpu excess counts as its own only beyond that:
//
//	excess_p(r) = p(r) − median over ranks s ≠ r of p(s)
//	delay(r)    = max(0, excess_data(r)) + max(0, excess_host(r))
//	own_gpu(r)  = max(0, excess_gpu(r) − max over s ≠ r of delay(s))
//	own(r)      = delay(r) + own_gpu(r)
//	hidden(r)   = min(max(0, gpu(r) − gpu(c)), delay(c)), c the rank of the largest delay
//
// hidden is the wait a rank's gpu phases hold for the step's slowest
// rank. Over the window each rank's figures are medians over the steps,
// so one slow step does not name a rank; its cause is the part (data,
// host or gpu) of the largest median. The rank is an own-work straggler
// when its median own excess is above the threshold (OwnThreshold).

// Causes of an own-work straggler.
const (
	CauseData = "data"
	CauseHost = "host"
	CauseGPU  = "gpu"
)

// OwnFloorMS is the smallest own-work excess that names a straggler,
// whatever the step time: below it a step of a millisecond would name
// its scheduling noise.
const OwnFloorMS = 1.0

// OwnRank is one rank's own-work figures over a window: medians over the
// steps every rank reported, in milliseconds.
type OwnRank struct {
	Rank int
	// ExcessMS is the median own excess (data + host + own gpu), and
	// DataMS, HostMS and GPUMS the medians of its parts.
	ExcessMS, DataMS, HostMS, GPUMS float64
	// HiddenWaitMS is the median wait for the step's slowest rank
	// hidden in this rank's forward, backward and optimizer.
	HiddenWaitMS float64
	// Cause is the part of the largest median excess, "" when none is
	// positive.
	Cause string
}

// OwnWork is the own-work figures of a run's ranks over a window.
type OwnWork struct {
	Ranks map[int]OwnRank
	// Steps is how many steps every rank reported with the phases.
	Steps int
	// MedStepMS is the median over those steps of the ranks' median
	// step time: the scale of the threshold.
	MedStepMS float64
}

// OwnThreshold is the own excess above which a rank is an own-work
// straggler: pct % of the median step, at least OwnFloorMS.
func (o OwnWork) OwnThreshold(pct float64) float64 {
	return math.Max(OwnFloorMS, o.MedStepMS*pct/100)
}

// Stragglers returns the ranks whose median own excess is above
// OwnThreshold(pct), lowest first; none when fewer than MinScored steps
// were seen.
func (o OwnWork) Stragglers(pct float64) []int {
	if o.Steps < MinScored {
		return nil
	}
	th := o.OwnThreshold(pct)
	var out []int
	for _, r := range slices.Sorted(maps.Keys(o.Ranks)) {
		if o.Ranks[r].ExcessMS > th {
			out = append(out, r)
		}
	}
	return out
}

// parts is one rank's split of one step; NaN where not measured.
type parts struct{ data, host, gpu float64 }

// splitStep splits a step row into data, host and gpu time. gpu and host
// need forward and backward; a missing optimizer, wait or data counts 0
// in host time.
func splitStep(s StepRow) parts {
	val := func(p *float64) float64 {
		if !num(p) || *p < 0 {
			return 0
		}
		return *p
	}
	p := parts{data: math.NaN(), host: math.NaN(), gpu: math.NaN()}
	if num(s.DataMS) {
		p.data = math.Max(0, *s.DataMS)
	}
	if !num(s.ForwardMS) || !num(s.BackwardMS) {
		return p
	}
	p.gpu = val(s.ForwardMS) + val(s.BackwardMS) + val(s.OptimizerMS)
	if num(s.StepMS) {
		wait := math.Max(val(s.SyncWaitMS), val(s.CommExposedMS))
		p.host = math.Max(0, *s.StepMS-val(s.DataMS)-p.gpu-wait-val(s.InputWaitMS))
	}
	return p
}

// OwnWorkOf computes each rank's own-work figures over the newest window
// steps of each rank (newest first, as ByRank groups them) that every rank
// reported. A caller with per-rank means instead of steps (a run read from
// rollups) passes one row a rank, all with the same Step; the figures are
// then those of the means. Nil Ranks for fewer than two ranks.
func OwnWorkOf(byRank map[int][]StepRow, window int) OwnWork {
	ranks, steps, rows := completeSteps(byRank, window)
	out := OwnWork{MedStepMS: math.NaN()}
	if len(ranks) < 2 {
		return out
	}
	n := len(ranks)
	acc := make([]struct{ own, data, host, gpu, hidden []float64 }, n)
	var medSteps []float64
	data, host, gpu, delay := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	for _, st := range steps {
		m := rows[st]
		var stepMS []float64
		for i, r := range ranks {
			p := splitStep(m[r])
			data[i], host[i], gpu[i] = p.data, p.host, p.gpu
			if num(m[r].StepMS) {
				stepMS = append(stepMS, *m[r].StepMS)
			}
		}
		if allNaN(gpu) && allNaN(data) {
			continue // no phases recorded at this step
		}
		out.Steps++
		if len(stepMS) > 0 {
			medSteps = append(medSteps, stats.Median(stepMS))
		}
		exData, exHost, exGPU := looExcess(data), looExcess(host), looExcess(gpu)
		slow, second := -1, -1 // the two ranks of the largest delay
		for i := range ranks {
			delay[i] = pos(exData[i]) + pos(exHost[i])
			switch {
			case slow < 0 || delay[i] > delay[slow]:
				slow, second = i, slow
			case second < 0 || delay[i] > delay[second]:
				second = i
			}
		}
		for i := range ranks {
			capMS := 0.0 // the largest delay of another rank
			if c := slow; c == i {
				if second >= 0 {
					capMS = delay[second]
				}
			} else {
				capMS = delay[c]
			}
			ownGPU := pos(exGPU[i] - capMS)
			hidden := 0.0
			if i != slow && !math.IsNaN(gpu[i]) && !math.IsNaN(gpu[slow]) {
				hidden = math.Min(pos(gpu[i]-gpu[slow]), delay[slow])
			}
			a := &acc[i]
			a.own = append(a.own, delay[i]+ownGPU)
			a.data = append(a.data, pos(exData[i]))
			a.host = append(a.host, pos(exHost[i]))
			a.gpu = append(a.gpu, ownGPU)
			a.hidden = append(a.hidden, hidden)
		}
	}
	if out.Steps == 0 {
		return out
	}
	if len(medSteps) > 0 {
		out.MedStepMS = stats.Median(medSteps)
	}
	out.Ranks = make(map[int]OwnRank, n)
	for i, r := range ranks {
		a := acc[i]
		o := OwnRank{Rank: r, ExcessMS: toSent(stats.Median(a.own)), DataMS: toSent(stats.Median(a.data)),
			HostMS: toSent(stats.Median(a.host)), GPUMS: toSent(stats.Median(a.gpu)),
			HiddenWaitMS: toSent(stats.Median(a.hidden))}
		best := 0.0
		for _, c := range []struct {
			name string
			v    float64
		}{{CauseData, o.DataMS}, {CauseHost, o.HostMS}, {CauseGPU, o.GPUMS}} {
			if c.v > best {
				best, o.Cause = c.v, c.name
			}
		}
		out.Ranks[r] = o
	}
	return out
}

// looExcess returns each value less the median of the others (NaN where
// the value, or every other value, is NaN). Sorting once makes it
// n log n: the median without one element is read off the sorted rest.
func looExcess(v []float64) []float64 {
	out := make([]float64, len(v))
	idx := make([]int, 0, len(v))
	for i, x := range v {
		out[i] = math.NaN()
		if !math.IsNaN(x) {
			idx = append(idx, i)
		}
	}
	if len(idx) < 2 {
		return out
	}
	slices.SortFunc(idx, func(a, b int) int { return cmpF(v[a], v[b]) })
	sorted := make([]float64, len(idx))
	for k, i := range idx {
		sorted[k] = v[i]
	}
	m := len(sorted) - 1              // the others' count
	at := func(k, skip int) float64 { // k-th of sorted without position skip
		if k >= skip {
			k++
		}
		return sorted[k]
	}
	for k, i := range idx {
		med := at(m/2, k)
		if m%2 == 0 {
			med = (at(m/2-1, k) + med) / 2
		}
		out[i] = v[i] - med
	}
	return out
}

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// sentMS is the precision of the timings the hook sends (four decimals of
// a millisecond): a difference of them is rounded to it, so that equal
// parts read 0 ms, not the 2e-16 ms their float difference leaves.
const sentMS = 1e-4

func toSent(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return v
	}
	return math.Round(v/sentMS) * sentMS
}

func pos(v float64) float64 {
	if math.IsNaN(v) || v < 0 {
		return 0
	}
	return v
}

func allNaN(v []float64) bool {
	for _, x := range v {
		if !math.IsNaN(x) {
			return false
		}
	}
	return true
}
