package fleettest

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/deepseed/deepseed/api"
)

// Records returns the run's records in the order a training job would
// send them: the run, then its steps, layers, evaluations, events and
// samples, then its end.
func (r *DemoRun) Records() []any {
	if r.kind == "bert" {
		return r.bertRecords()
	}
	return r.pythiaRecords()
}

func (r *DemoRun) runRecord() *api.Run {
	cfg, _ := json.Marshal(r.Config)
	params, _ := json.Marshal(r.Params)
	m := r.Meta
	return &api.Run{Kind: api.KindRun, RunID: r.ID, Project: DemoProject, Name: r.Name, StartedAt: api.T(r.Start),
		Config: cfg, Meta: &m, Params: params, Tags: []string{"simulated", "demo"}, SweepID: r.Sweep, Code: r.code()}
}

// alternating returns ±a, the sign alternating with i, so that any long
// enough run of steps averages to the exact target.
func alternating(i int64, a float64) float64 {
	if i%2 == 0 {
		return a
	}
	return -a
}

func (r *DemoRun) pythiaRecords() []any {
	rng := rand.New(rand.NewPCG(r.Seed, 0x5eed))
	f := r.Figures
	out := []any{r.runRecord()}
	interval := time.Duration(float64(time.Second) / f.StepsPerSec)
	const warmup = 10
	var last time.Time
	for rank := 0; rank < r.Ranks; rank++ {
		t := r.Start.Add(20 * time.Second) // model load
		for i := int64(0); i <= r.Steps; i++ {
			stepMS := f.StepTimeS * 1000 * (1 + alternating(i+int64(rank), 0.004))
			mem := f.GPUMemMB / 1000
			util := f.GPUUtilPct + alternating(i+int64(rank), 2)
			cpu := f.CPUUtilPct + alternating(i+int64(rank), 1.5)
			dt := interval
			if i < warmup {
				// Warm-up: kernels compile and the allocator grows.
				k := float64(warmup-i) / warmup
				stepMS *= 1 + 2.5*k
				dt = time.Duration(float64(dt) * (1 + 2.5*k))
				mem *= 0.6 + 0.4*float64(i)/warmup
				util *= 0.5 + 0.5*float64(i)/warmup
			}
			t = t.Add(dt)
			loss := 2.9 + 7.9*math.Exp(-float64(i)/40) + 0.05*rng.NormFloat64()
			samples := int64(orOne(r.Meta.MicroBatch) * orOne(r.Meta.GradAccum))
			s := &api.Step{Kind: api.KindStep, RunID: r.ID, Rank: rank, Step: api.Ptr(i), Time: api.T(t),
				Epoch: api.F(float64(i) / float64(r.Steps)), Loss: api.F(loss), LR: api.F(lrAt(i, 6e-4, warmup, r.Steps)),
				GradNorm: api.F(0.6 + 2*math.Exp(-float64(i)/30) + 0.1*rng.Float64()), Samples: api.Ptr(samples),
				Tokens:        api.Ptr(samples * 512),
				ThroughputSPS: api.F(float64(samples) * f.StepsPerSec), StepMS: api.F(stepMS),
				ForwardMS: api.F(stepMS * 0.3), BackwardMS: api.F(stepMS * 0.45), OptimizerMS: api.F(stepMS * 0.12),
				CommMS: api.F(stepMS * 0.08), DataMS: api.F(stepMS * 0.02),
				GPUUtilPct: api.F(util), GPUMemUsedGB: api.F(mem), GPUMemPeakGB: api.F(mem * 1.015), CPUUtilPct: api.F(cpu)}
			if r.Meta.Precision == "fp16" {
				s.LossScale = api.F(65536)
			}
			// Arrival at the end-of-backward all-reduce: a millisecond or
			// two apart; each rank waits for the last, then the reduce.
			arrive, lastLate := allReduce(r.Ranks, func(k int) float64 { return demoLate(k, i) })
			late := arrive[rank]
			s.SyncNS = api.Ptr(t.Add(-time.Duration(stepMS*0.2*float64(time.Millisecond))).UnixNano() + int64(late*1e6))
			s.SyncWaitMS = api.F(lastLate - late + stepMS*0.08)
			s.InputWaitMS = api.F(stepMS * 0.01)
			withFlops(s, r.Meta)
			out = append(out, s, r.layers(rank, i, t, stepMS/(f.StepTimeS*1000), rng))
		}
		last = t
	}
	for st := int64(100); st <= r.Steps; st += 100 {
		out = append(out, &api.Eval{Kind: api.KindEval, RunID: r.ID, Step: api.Ptr(st),
			Time: api.T(r.Start.Add(20*time.Second + time.Duration(st)*interval)), Split: "val",
			Loss: api.F(3.1 + 7.5*math.Exp(-float64(st)/40)), Accuracy: api.F(0.31 + 0.05*float64(st)/300)})
	}
	end := r.Start.Add(40*time.Second + time.Duration(r.Steps+warmup*3)*interval)
	out = append(out, r.telemetry(r.pythiaLoad(interval, last, end), r.idleFrom, r.idleTo)...)
	out = append(out, r.memoryRecord(), &api.End{Kind: api.KindEnd, RunID: r.ID, Time: api.T(end), Status: api.StatusFinished})
	return out
}

// pythiaLoad is what a pythia run asks of its GPUs and host: the table's
// utilisation and memory (NVML's memory a little above the allocator's
// mean, within the peak the steps report), and the traffic of its
// collectives. On the T4 node they cross PCIe: each step all-reduces the
// gradients (ZeRO-3 also gathers the parameters, offload moves gradients
// to the CPU and parameters back, a pipeline only passes activations); on
// the H100 node they cross NVLink, and PCIe carries only the input.
func (r *DemoRun) pythiaLoad(interval time.Duration, last, end time.Time) gpuLoad {
	f := r.Figures
	p := float64(*r.Meta.Params)
	bpp := 2.0
	if r.Meta.Precision == "fp32" {
		bpp = 4
	}
	grads := p * bpp
	perStep := grads
	if *r.Meta.ZeroStage >= 3 {
		perStep += grads
	}
	if r.Meta.OffloadOptim == "cpu" {
		perStep += 2 * grads
	}
	if r.Meta.PipelineStages != nil && *r.Meta.PipelineStages > 1 {
		perStep = 0.15 * grads
	}
	l := gpuLoad{util: f.GPUUtilPct, memBytes: f.GPUMemMB * 1e6 * 1.01, busyFrom: r.Start.Add(20 * time.Second), busyTo: last, end: end,
		warmup: 25 * interval, pcieBps: perStep / f.StepTimeS, hostCPU: f.CPUUtilPct, rss: 3.1e9, pid0: 2000 + 10*int64(r.Seed)}
	if r.Meta.OffloadOptim == "cpu" {
		// The optimizer state and fp32 master weights, in pinned memory.
		l.rss += p * 12 / float64(r.Ranks) * 1.2
	}
	if r.node.hopper {
		n := float64(r.Ranks)
		l.pcieBps, l.nvlinkBps = 25e6, grads*2*(n-1)/n/f.StepTimeS
		l.eccAt = l.busyFrom.Add(11 * time.Minute)
	}
	return l
}

// layers returns one layers record; slow scales the steady timings.
func (r *DemoRun) layers(rank int, step int64, t time.Time, slow float64, rng *rand.Rand) *api.Layers {
	return layersRecord(r.ID, rank, step, t, r.Layers, func(j int) (float64, float64) {
		v := r.LayerMS[j] * slow * (1 + 0.04*rng.NormFloat64())
		return v, v * (1.9 + 0.1*rng.Float64())
	})
}

func (r *DemoRun) memoryRecord() *api.Memory {
	params, grads, optim := api.ModelStateBytes(float64(*r.Meta.Params), r.Meta.Precision, orOne(r.Meta.WorldSize), *r.Meta.ZeroStage)
	m := &api.Memory{Kind: api.KindMemory, RunID: r.ID, Time: api.T(r.Start), ParametersBytes: api.F(params),
		GradientsBytes: api.F(grads), OptimizerBytes: api.F(optim), OptimizerDevice: "gpu", ParametersDevice: "gpu",
		ActivationsBytes: api.F(float64(orOne(r.Meta.MicroBatch)) * 512 * 768 * 12 * 34)}
	if r.Meta.OffloadOptim == "cpu" {
		m.OptimizerDevice = "cpu"
	}
	if r.Meta.OffloadParams == "cpu" {
		m.ParametersDevice = "cpu"
	}
	return m
}

func lrAt(step int64, peak float64, warmup, total int64) float64 {
	if step < warmup {
		return peak * float64(step) / float64(warmup)
	}
	return peak * math.Max(0, float64(total-step)/float64(total-warmup))
}

func (r *DemoRun) bertRecords() []any {
	rng := rand.New(rand.NewPCG(r.Seed, 0xbe27))
	out := []any{r.runRecord()}
	// Optimizer steps take ~0.67 s (4 micro-batches of ~168 ms); the first
	// few are slower while CUDA warms up.
	t := r.Start.Add(95 * time.Second) // model load and tokenisation
	scale := 65536.0
	overflows := map[int64]bool{5: true, 10: true, 15: true, 1105: true}
	var stepTimes []time.Time
	for i := int64(0); i <= r.Steps; i += r.Every {
		warm := 1.0
		if i < 50 {
			warm = 1 + 1.5*float64(50-i)/50
		}
		fwd := 48 * warm * (1 + 0.03*rng.NormFloat64())
		bwd := 92 * warm * (1 + 0.03*rng.NormFloat64())
		opt := 28 * (1 + 0.05*rng.NormFloat64())
		data := 3 + 3*rng.Float64()
		comm := 7 * (1 + 0.1*rng.NormFloat64())
		stepMS := fwd + bwd + opt + data + comm + 2
		t = t.Add(time.Duration(float64(r.Every) * 4 * stepMS * float64(time.Millisecond)))
		stepTimes = append(stepTimes, t)
		progress := float64(i) / float64(r.Steps)
		loss := 0.18 + 0.52*math.Exp(-float64(i)/350) + 0.06*rng.NormFloat64()*(1-progress*0.5)
		loss = math.Max(loss, 0.02)
		skipped := overflows[i]
		if skipped {
			scale /= 2
			out = append(out, &api.Event{Kind: api.KindEvent, RunID: r.ID, Time: api.T(t), Step: api.Ptr(i), Type: "overflow",
				Text: fmt.Sprintf("fp16 gradient overflow: skipped step, loss scale %g -> %g", scale*2, scale)})
		}
		gn := 0.4 + 3*math.Exp(-float64(i)/200) + 0.3*rng.Float64()
		if i == 1840 {
			gn = 9.7 // a gradient-norm spike, clipped to 1.0
		}
		mem := 10.5 + 0.3*rng.Float64()
		if i < 15 {
			mem = 2.5 + 8*float64(i)/15
		}
		util := math.Min(99, 91+5*rng.NormFloat64())
		s := &api.Step{Kind: api.KindStep, RunID: r.ID, Step: api.Ptr(i), Time: api.T(t),
			Epoch: api.F(3 * progress), Loss: api.F(loss), LR: api.F(lrAt(i, 2e-5, 150, 2400)), GradNorm: api.F(gn),
			LossScale: api.F(scale), Skipped: api.Ptr(skipped), Samples: api.Ptr(int64(16)), Tokens: api.Ptr(int64(16 * 256)),
			ThroughputSPS: api.F(16 / (4 * stepMS / 1000)), StepMS: api.F(4 * stepMS),
			ForwardMS: api.F(4 * fwd), BackwardMS: api.F(4 * bwd), OptimizerMS: api.F(opt), CommMS: api.F(4 * comm),
			DataMS: api.F(4 * data), GPUUtilPct: api.F(util), GPUMemUsedGB: api.F(mem), GPUMemPeakGB: api.F(mem + 0.35),
			CPUUtilPct: api.F(38 + 6*rng.Float64())}
		// The step time of an optimizer step covers 4 micro-batches but
		// only one optimizer update.
		s.StepMS = api.F(4*(fwd+bwd+data+comm+2) + opt)
		// One rank: its wait at the end of backward is the reduce alone.
		s.SyncNS = api.Ptr(t.Add(-time.Duration((opt + comm) * float64(time.Millisecond))).UnixNano())
		s.SyncWaitMS, s.InputWaitMS = api.F(comm), api.F(0.5)
		withFlops(s, r.Meta)
		out = append(out, s, r.layers(0, i, t, warm, rng))
		if i > 0 && i%1000 == 0 {
			out = append(out, &api.Event{Kind: api.KindEvent, RunID: r.ID, Time: api.T(t.Add(2 * time.Second)), Step: api.Ptr(i),
				Type: "checkpoint", Text: fmt.Sprintf("saved checkpoints/step_%d (4.7 GB)", i)})
		}
		if i > 0 && i%200 == 0 {
			acc := 0.5 + 0.43*(1-math.Exp(-float64(i)/600))/(1-math.Exp(-2200.0/600))
			if i == 200 {
				acc = 0.51
			}
			acc = math.Min(acc+0.005*rng.NormFloat64(), 0.935)
			out = append(out, &api.Eval{Kind: api.KindEval, RunID: r.ID, Step: api.Ptr(i), Time: api.T(t.Add(time.Second)),
				Split: "val", Loss: api.F(0.25 + 0.45*math.Exp(-float64(i)/500)), Accuracy: api.F(acc), F1: api.F(acc - 0.004)})
		}
	}
	// The GPU works from the first step; it idles while the model loads
	// and the last checkpoint is saved. Each optimizer step moves the fp16
	// gradients to the CPU optimizer and the parameters back over PCIe.
	end := stepTimes[len(stepTimes)-1]
	l := gpuLoad{util: 91, memBytes: 10.65e9, busyFrom: stepTimes[0].Add(-3 * time.Second), busyTo: end, end: end.Add(30 * time.Second),
		warmup: 2 * time.Minute, pcieBps: 2 * 0.670e9 / 0.63, hostCPU: 40, rss: 7.2e9, pid0: 4242}
	out = append(out, r.telemetry(l, r.idleFrom, r.idleTo)...)
	out = append(out, &api.Memory{Kind: api.KindMemory, RunID: r.ID, Time: api.T(r.Start),
		ParametersBytes: api.F(0.670e9), GradientsBytes: api.F(0.670e9), OptimizerBytes: api.F(4.022e9),
		OptimizerDevice: "cpu", ParametersDevice: "gpu", ActivationsBytes: api.F(0.201e9)},
		&api.End{Kind: api.KindEnd, RunID: r.ID, Time: api.T(end.Add(30 * time.Second)), Status: api.StatusFinished,
			Summary: json.RawMessage(`{"final_accuracy":0.93,"final_f1":0.926,"total_time_minutes":42.3}`)})
	return out
}

func orOne(p *int) int {
	if p == nil || *p < 1 {
		return 1
	}
	return *p
}

// demoLate is how many milliseconds after the first rank a demo rank
// reaches the all-reduce at step i.
func demoLate(rank int, i int64) float64 { return 1 + alternating(i*31+int64(rank)*7, 1) }
