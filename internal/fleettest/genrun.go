package fleettest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// GenRun is the shape of the store's tests and reports: a generated
// training run with the noise of a real one, seeded: timings jitter
// around a steady state, loss decays with noise, every layer's time
// wanders on its own. Nothing repeats exactly, so compression figures
// measured on it are not flattered.
type GenRun struct {
	ID     string
	Ranks  int
	Steps  int
	Start  time.Time
	Every  time.Duration // time between steps
	Seed   uint64
	Layers int // transformer blocks; embeddings and head come on top
	// EvalEvery is the step interval of evaluations (0: none).
	EvalEvery int
	// Period, when above 0, sends what the hook samples as a single
	// process does by default: the gradient norm and a layers record
	// every Period steps, forward/backward/optimizer/communication times
	// on the steps half way between. 0 sends all of them on every step.
	Period int
}

// LayerNames returns the run's layer names, as the hook reports them.
func (g GenRun) LayerNames() []string {
	return layerNames("model.embed_tokens", "model.layers", g.Layers, "model.norm", "lm_head")
}

// StepLines returns the step and layers records of rank, for steps
// [from, to), stamped shift later than the run's own times.
func (g GenRun) StepLines(rank, from, to int, shift time.Duration) []string {
	rng := rand.New(rand.NewPCG(g.Seed+uint64(rank)*7919+uint64(from), 0x5eed))
	names := g.LayerNames()
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = fmt.Sprintf("%q", n)
	}
	nameList := "[" + strings.Join(quoted, ",") + "]"
	base := make([]float64, len(names))
	for j := range base {
		base[j] = 2.5 + 0.4*math.Sin(float64(j)) // each layer its own mean
	}
	base[0], base[len(base)-1] = 0.8, 6.1
	var out []string
	for i := from; i < to; i++ {
		t := g.Start.Add(time.Duration(i)*g.Every + shift).UTC().Format(time.RFC3339Nano)
		// As the hook sends them: durations rounded to 0.1 µs, losses and
		// norms as the float32 tensors they were read from.
		stepMS := ms4(412 * (1 + 0.03*rng.NormFloat64()))
		loss := f32(2.1 + 8*math.Exp(-float64(i)/900) + 0.08*rng.NormFloat64())
		lr := 3e-4 * math.Min(1, float64(i+1)/500) * (0.5 + 0.5*math.Cos(math.Pi*float64(i)/float64(g.Steps)))
		norm := f32(0.4 + 1.5*math.Exp(-float64(i)/400) + 0.05*rng.ExpFloat64())
		fwdMS, bwdMS, optMS := ms4(stepMS*(0.31+0.01*rng.NormFloat64())), ms4(stepMS*(0.46+0.01*rng.NormFloat64())), ms4(stepMS*(0.12+0.005*rng.NormFloat64()))
		commMS, dataMS := ms4(stepMS*(0.07+0.01*rng.NormFloat64())), ms4(math.Abs(stepMS*(0.02+0.01*rng.NormFloat64())))
		gpuUtil, memUsed := math.Round(math.Min(100, 91+4*rng.NormFloat64())), float64(int64(61.2e9+3e8*rng.NormFloat64()))/1e9
		memPeak, cpuUtil := float64(int64(63.9e9+1e8*rng.NormFloat64()))/1e9, math.Round(10*(101+9*rng.NormFloat64()))/10
		var b strings.Builder
		fmt.Fprintf(&b, `{"kind":"step","run_id":%q,"rank":%d,"step":%d,"time":%q,"epoch":%g,"loss":%g,"lr":%g,`,
			g.ID, rank, i, t, float64(i)/float64(g.Steps)*3, loss, lr)
		if g.Period <= 0 || i%g.Period == 0 {
			fmt.Fprintf(&b, `"grad_norm":%g,`, norm)
		}
		fmt.Fprintf(&b, `"loss_scale":65536,"samples":32,"tokens":16384,"throughput_sps":%g,"step_ms":%g,`, 32000/stepMS, stepMS)
		if g.Period <= 0 || i%g.Period == g.Period/2 {
			fmt.Fprintf(&b, `"forward_ms":%g,"backward_ms":%g,"optimizer_ms":%g,"comm_ms":%g,`, fwdMS, bwdMS, optMS, commMS)
		}
		fmt.Fprintf(&b, `"data_ms":%g,"gpu_util_pct":%g,"gpu_mem_used_gb":%g,"gpu_mem_peak_gb":%g,"cpu_util_pct":%g}`,
			dataMS, gpuUtil, memUsed, memPeak, cpuUtil)
		out = append(out, b.String())
		fwd := make([]string, len(names))
		bwd := make([]string, len(names))
		for j := range names {
			base[j] *= 1 + 0.002*rng.NormFloat64() // slow drift
			v := base[j] * (1 + 0.04*rng.NormFloat64())
			fwd[j] = fmt.Sprint(ms4(v))
			bwd[j] = fmt.Sprint(ms4(v * (1.9 + 0.1*rng.Float64())))
		}
		if g.Period > 0 && i%g.Period != 0 {
			continue
		}
		out = append(out, fmt.Sprintf(`{"kind":"layers","run_id":%q,"rank":%d,"step":%d,"time":%q,"names":%s,"forward_ms":[%s],"backward_ms":[%s]}`,
			g.ID, rank, i, t, nameList, strings.Join(fwd, ","), strings.Join(bwd, ",")))
	}
	return out
}

// EvalLines returns the run's evaluations.
func (g GenRun) EvalLines() []string {
	if g.EvalEvery <= 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(g.Seed, 0xe7a1))
	var out []string
	for i := g.EvalEvery; i <= g.Steps; i += g.EvalEvery {
		t := g.Start.Add(time.Duration(i)*g.Every + 5*time.Second).UTC().Format(time.RFC3339Nano)
		out = append(out, fmt.Sprintf(`{"kind":"eval","run_id":%q,"step":%d,"time":%q,"split":"val","loss":%g,"accuracy":%g,"f1":%g}`,
			g.ID, i, t, 2.3+8*math.Exp(-float64(i)/900)+0.05*rng.NormFloat64(),
			0.9-0.6*math.Exp(-float64(i)/1500)+0.01*rng.NormFloat64(), 0.88-0.6*math.Exp(-float64(i)/1500)+0.01*rng.NormFloat64()))
	}
	return out
}

// GPULines returns 1 Hz samples of gpus GPUs of host over the run.
func (g GenRun) GPULines(host string, gpus int) []string {
	rng := rand.New(rand.NewPCG(g.Seed, 0x69b0))
	end := g.Start.Add(time.Duration(g.Steps) * g.Every)
	var out []string
	for t := g.Start; t.Before(end); t = t.Add(time.Second) {
		ts := t.UTC().Format(time.RFC3339Nano)
		for gpu := range gpus {
			util := math.Min(100, math.Max(0, 92+6*rng.NormFloat64()))
			out = append(out, fmt.Sprintf(`{"kind":"gpu","time":%q,"host":%q,"gpu":%d,"run_id":%q,"util_pct":%g,"mem_util_pct":%g,`+
				`"mem_used_bytes":%d,"mem_total_bytes":150754820096,"power_w":%g,"temp_c":%d,"sm_clock_mhz":%d}`,
				ts, host, gpu, g.ID, math.Round(util), math.Round(util*0.6),
				int64(65.7e9+2e8*rng.NormFloat64())/1048576*1048576, math.Round((540+60*rng.NormFloat64())*1000)/1000,
				int(61+3*rng.NormFloat64()), 1980-15*rng.IntN(4)))
		}
	}
	return out
}

// f32 is v as read from a float32 tensor.
func f32(v float64) float64 { return float64(float32(v)) }
