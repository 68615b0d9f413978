package main

import (
	"fmt"
	"math"
	"time"

	"github.com/deepseed/deepseed/api"
)

// fleetRun is a synchronous data-parallel run of many ranks, as the hook
// and the collectors of its nodes would send it: every rank sends a step
// record a step (with its arrival at the gradient all-reduce and its wait
// there), a layers record every layerEvery steps, an evaluation every
// evalEvery steps, and the collector of every node a sample of each of
// its gpusPerNode GPUs a second. One rank is planted 30 ms late.
type fleetRun struct {
	runID       string
	ranks       int
	steps       int
	layers      int
	layerEvery  int
	evalEvery   int
	gpusPerNode int
	straggler   int // the late rank; -1 for none
	start       time.Time
}

// fleetStepPeriod is the wall-clock time between two steps.
const fleetStepPeriod = 550 * time.Millisecond

// fleetLate is how late the planted straggler reaches the all-reduce.
const fleetLate = 30.0 // ms

func (f fleetRun) host(rank int) string {
	return fmt.Sprintf("%s-node-%03d", f.runID, rank/max(f.gpusPerNode, 1))
}

func (f fleetRun) layerNames() []string {
	names := make([]string, f.layers)
	for i := range names {
		switch {
		case i == 0:
			names[i] = "embeddings"
		case i == f.layers-1:
			names[i] = "lm_head"
		default:
			names[i] = fmt.Sprintf("layers.%d", i-1)
		}
	}
	return names
}

// runRecord announces the run.
func (f fleetRun) runRecord() api.Record {
	world := f.ranks
	params := int64(1_400_000_000)
	return api.Record{Run: &api.Run{Kind: api.KindRun, RunID: f.runID, Project: "bench", Name: f.runID,
		StartedAt: api.T(f.start), Tags: []string{"bench"},
		Meta: &api.RunMeta{Model: "fleet-1.4b", Params: &params, GPU: "NVIDIA H100 80GB HBM3", WorldSize: &world,
			Precision: "bf16", Parallelism: "ddp"}}}
}

// endRecord ends the run.
func (f fleetRun) endRecord() api.Record {
	return api.Record{End: &api.End{Kind: api.KindEnd, RunID: f.runID, Time: api.T(f.stepTime(int64(f.steps))),
		Status: api.StatusFinished}}
}

func (f fleetRun) stepTime(s int64) time.Time {
	return f.start.Add(time.Duration(s) * fleetStepPeriod)
}

// jitter is a deterministic spread of a few milliseconds by rank and step.
func jitter(s int64, r int) float64 { return float64((int(s)*31+r*17)%100) / 25 }

// stepRecords returns the step, layers and evaluation records of steps
// [from, from+n).
func (f fleetRun) stepRecords(from, n int64) []api.Record {
	names := f.layerNames()
	recs := make([]api.Record, 0, int(n)*f.ranks*2)
	for s := from; s < from+n && s < int64(f.steps); s++ {
		step := s
		t := f.stepTime(s)
		loss := 2.5*math.Exp(-float64(s)/20000) + 1.8
		// Arrivals at the all-reduce: busy time plus jitter, the
		// straggler later; every rank leaves when the last arrives.
		arrive := make([]float64, f.ranks)
		last := 0.0
		for r := range arrive {
			arrive[r] = 140 + jitter(s, r)
			if r == f.straggler {
				arrive[r] += fleetLate
			}
			last = max(last, arrive[r])
		}
		stepMS := last + 25
		base := t.UnixNano()
		for r := 0; r < f.ranks; r++ {
			wait := ms4(last - arrive[r] + 0.2)
			sync := base + int64(arrive[r]*1e6)
			recs = append(recs, api.Record{Step: &api.Step{Kind: api.KindStep, RunID: f.runID, Rank: r, Step: &step,
				Time: api.T(t.Add(time.Duration(stepMS * float64(time.Millisecond)))),
				Loss: api.F(loss + jitter(s, r)/100), LR: api.F(3e-4), Samples: api.Ptr(s * 8), Tokens: api.Ptr(s * 8 * 2048),
				ThroughputSPS: api.F(ms4(8000 / stepMS)), StepMS: api.F(ms4(stepMS)), DataMS: api.F(ms4(1.5 + jitter(s, r)/10)),
				SyncNS: &sync, SyncWaitMS: api.F(wait), TFLOPS: api.F(ms4(310 - jitter(s, r))), MFU: api.F(ms4(0.31))}})
			if f.layerEvery > 0 && s%int64(f.layerEvery) == 0 {
				fwd := make([]api.Float, len(names))
				bwd := make([]api.Float, len(names))
				for i := range names {
					v := 1.2 + float64(i%7)/10 + jitter(s, r)/50
					fwd[i], bwd[i] = api.Float(ms4(v)), api.Float(ms4(2*v))
				}
				recs = append(recs, api.Record{Layers: &api.Layers{Kind: api.KindLayers, RunID: f.runID, Rank: r, Step: &step,
					Time: api.T(t), Names: names, ForwardMS: fwd, BackwardMS: bwd}})
			}
		}
		if f.evalEvery > 0 && s > 0 && s%int64(f.evalEvery) == 0 {
			recs = append(recs, api.Record{Eval: &api.Eval{Kind: api.KindEval, RunID: f.runID, Step: &step, Time: api.T(t),
				Split: "val", Loss: api.F(loss - 0.05), Accuracy: api.F(0.4 + 0.3*(1-math.Exp(-float64(s)/30000)))}})
		}
	}
	return recs
}

// gpuRecords returns the GPU samples of every node for the steps
// [from, from+n), one a second and GPU, attributed to the run.
func (f fleetRun) gpuRecords(from, n int64) []api.Record {
	t0, t1 := f.stepTime(from), f.stepTime(min(from+n, int64(f.steps)))
	first := t0.Truncate(time.Second)
	if first.Before(t0) {
		first = first.Add(time.Second)
	}
	var recs []api.Record
	total := 80e9
	for t := first; t.Before(t1); t = t.Add(time.Second) {
		for r := 0; r < f.ranks; r++ {
			gpu, rank := r%max(f.gpusPerNode, 1), r
			util := 97 - jitter(int64(t.Unix()), r)
			if r == f.straggler {
				util = 71
			}
			recs = append(recs, api.Record{GPU: &api.GPU{Kind: api.KindGPU, Time: api.T(t), Host: f.host(r), GPU: &gpu,
				RunID: f.runID, Rank: &rank, Name: "NVIDIA H100 80GB HBM3",
				UtilPct: api.F(util), MemUsedBytes: api.F(61e9 + float64(r%8)*1e8), MemTotalBytes: &[]api.Float{api.Float(total)}[0],
				PowerW: api.F(612 - jitter(int64(t.Unix()), r)), TempC: api.F(64), SMClockMHz: api.F(1980)}})
		}
	}
	return recs
}

// ms4 rounds to four decimals of a millisecond, as the hook sends.
func ms4(v float64) float64 { return math.Round(v*1e4) / 1e4 }
