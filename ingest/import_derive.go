package ingest

import (
	"math"
	"sort"
	"time"

	"github.com/deepseed/deepseed/api"
)

// deriveStepTimes fills what an export leaves out: a step's time and its
// throughput. steps are the parsed records, n their step numbers and times
// the timestamps the export itself gave (zero where it gave none; times the
// importer spread over the run are no measurement and are not used).
//
//   - step_ms, where missing: the wall clock between this step's timestamp
//     and the previous logged one, divided by the steps between them (the
//     interval to the next one for the first); without timestamps, the sum
//     of the phases the step has (forward + backward + optimizer + data;
//     communication overlaps backward and is left out), a lower bound.
//   - throughput_sps / throughput_tps, where missing: samples (else the
//     run's effective batch) and tokens over step_ms.
func deriveStepTimes(steps []*api.Step, n []int64, times []time.Time, meta *api.RunMeta) {
	var timed []int
	for i := range steps {
		if steps[i] != nil && !times[i].IsZero() {
			timed = append(timed, i)
		}
	}
	sort.SliceStable(timed, func(a, b int) bool { return n[timed[a]] < n[timed[b]] })
	perStep := func(a, b int) (float64, bool) {
		dn := n[b] - n[a]
		dt := times[b].Sub(times[a])
		if dn <= 0 || dt <= 0 {
			return 0, false
		}
		return float64(dt) / float64(time.Millisecond) / float64(dn), true
	}
	fromClock := make(map[int]float64, len(timed))
	for k, i := range timed {
		if k > 0 {
			if ms, ok := perStep(timed[k-1], i); ok {
				fromClock[i] = ms
				continue
			}
		}
		if k+1 < len(timed) {
			if ms, ok := perStep(i, timed[k+1]); ok {
				fromClock[i] = ms
			}
		}
	}

	for i, s := range steps {
		if s == nil {
			continue
		}
		if s.StepMS == nil {
			if ms, ok := fromClock[i]; ok {
				s.StepMS = api.F(roundMS(ms))
			} else if ms, ok := phaseSum(s); ok {
				s.StepMS = api.F(roundMS(ms))
			}
		}
		if s.StepMS == nil {
			continue
		}
		ms := float64(*s.StepMS)
		if !(ms > 0) || math.IsInf(ms, 0) {
			continue
		}
		if s.ThroughputSPS == nil {
			switch {
			case s.Samples != nil:
				s.ThroughputSPS = api.F(float64(*s.Samples) * 1000 / ms)
			case meta != nil && meta.EffectiveBatch != nil && *meta.EffectiveBatch > 0:
				s.ThroughputSPS = api.F(float64(*meta.EffectiveBatch) * 1000 / ms)
			}
		}
		if s.ThroughputTPS == nil && s.Tokens != nil {
			s.ThroughputTPS = api.F(float64(*s.Tokens) * 1000 / ms)
		}
	}
}

func phaseSum(s *api.Step) (float64, bool) {
	var sum float64
	var any bool
	for _, f := range []*api.Float{s.ForwardMS, s.BackwardMS, s.OptimizerMS, s.DataMS} {
		if f == nil {
			continue
		}
		v := float64(*f)
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			continue
		}
		sum += v
		any = true
	}
	return sum, any && sum > 0
}

// roundMS rounds a duration in milliseconds to four decimals, as the
// Python hook does before sending it.
func roundMS(ms float64) float64 { return math.Round(ms*1e4) / 1e4 }
