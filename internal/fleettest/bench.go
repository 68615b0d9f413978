package fleettest

import (
	"fmt"
	"math"
	"time"

	"github.com/deepseed/deepseed/api"
)

// Bench is the run in the shape the query benchmark loads it (deepseed
// bench query): besides the all-reduce of [Run], every rank sends the
// training figures (loss, learning rate, samples, tokens, throughput,
// TFLOP/s, MFU) a step, a layers record every LayerEvery steps, an
// evaluation every EvalEvery steps, and the collector of every node a
// sample of each of its GPUsPerNode GPUs a second. Its steps are
// BenchStepPeriod apart.
type Bench struct {
	ID          string
	Ranks       int
	Steps       int
	Layers      int
	LayerEvery  int
	EvalEvery   int
	GPUsPerNode int
	Late        int // the late rank; -1 for none
	Start       time.Time
	SweepID     string // the sweep the run is a trial of; "" for none
	TotalSteps  int    // the steps its meta says it will take; 0 for unknown
}

// BenchStepPeriod is the wall-clock time between two steps.
const BenchStepPeriod = 550 * time.Millisecond

// Host is the node of a rank: GPUsPerNode ranks share one.
func (f Bench) Host(rank int) string {
	return fmt.Sprintf("%s-node-%03d", f.ID, rank/max(f.GPUsPerNode, 1))
}

// LayerNames are the run's layers, in model order.
func (f Bench) LayerNames() []string { return namedLayers(f.Layers, "layers", "lm_head") }

// RunRecord announces the run.
func (f Bench) RunRecord() api.Record {
	world := f.Ranks
	params := int64(1_400_000_000)
	rec := api.Record{Run: &api.Run{Kind: api.KindRun, RunID: f.ID, Project: "bench", Name: f.ID,
		StartedAt: api.T(f.Start), Tags: []string{"bench"}, SweepID: f.SweepID,
		Meta: &api.RunMeta{Model: "fleet-1.4b", Params: &params, GPU: "NVIDIA H100 80GB HBM3", WorldSize: &world,
			Precision: "bf16", Parallelism: "ddp"}}}
	if f.TotalSteps > 0 {
		rec.Run.Meta.TotalSteps = api.Ptr(int64(f.TotalSteps))
	}
	return rec
}

// EndRecord ends the run.
func (f Bench) EndRecord() api.Record {
	return api.Record{End: &api.End{Kind: api.KindEnd, RunID: f.ID, Time: api.T(f.StepTime(int64(f.Steps))),
		Status: api.StatusFinished}}
}

// StepTime is when step s begins.
func (f Bench) StepTime(s int64) time.Time {
	return f.Start.Add(time.Duration(s) * BenchStepPeriod)
}

// StepRecords returns the step, layers and evaluation records of steps
// [from, from+n).
func (f Bench) StepRecords(from, n int64) []api.Record {
	names := f.LayerNames()
	recs := make([]api.Record, 0, int(n)*f.Ranks*2)
	for s := from; s < from+n && s < int64(f.Steps); s++ {
		step := s
		t := f.StepTime(s)
		loss := 2.5*math.Exp(-float64(s)/20000) + 1.8
		arrive, last := Arrivals(s, f.Ranks, f.Late)
		stepMS := last + 25
		base := t.UnixNano()
		for r := 0; r < f.Ranks; r++ {
			wait := ms4(last - arrive[r] + 0.2)
			sync := base + int64(arrive[r]*1e6)
			recs = append(recs, api.Record{Step: &api.Step{Kind: api.KindStep, RunID: f.ID, Rank: r, Step: &step,
				Time: api.T(t.Add(time.Duration(stepMS * float64(time.Millisecond)))),
				Loss: api.F(loss + Spread(s, r)/100), LR: api.F(3e-4), Samples: api.Ptr(s * 8), Tokens: api.Ptr(s * 8 * 2048),
				ThroughputSPS: api.F(ms4(8000 / stepMS)), StepMS: api.F(ms4(stepMS)), DataMS: api.F(ms4(1.5 + Spread(s, r)/10)),
				SyncNS: &sync, SyncWaitMS: api.F(wait), TFLOPS: api.F(ms4(310 - Spread(s, r))), MFU: api.F(ms4(0.31))}})
			if f.LayerEvery > 0 && s%int64(f.LayerEvery) == 0 {
				recs = append(recs, api.Record{Layers: layersRecord(f.ID, r, s, t, names, func(i int) (float64, float64) {
					v := 1.2 + float64(i%7)/10 + Spread(s, r)/50
					return ms4(v), ms4(2 * v)
				})})
			}
		}
		if f.EvalEvery > 0 && s > 0 && s%int64(f.EvalEvery) == 0 {
			recs = append(recs, api.Record{Eval: &api.Eval{Kind: api.KindEval, RunID: f.ID, Step: &step, Time: api.T(t),
				Split: "val", Loss: api.F(loss - 0.05), Accuracy: api.F(0.4 + 0.3*(1-math.Exp(-float64(s)/30000)))}})
		}
	}
	return recs
}

// GPURecords returns the GPU samples of every node for the steps
// [from, from+n), one a second and GPU, attributed to the run.
func (f Bench) GPURecords(from, n int64) []api.Record {
	t0, t1 := f.StepTime(from), f.StepTime(min(from+n, int64(f.Steps)))
	first := t0.Truncate(time.Second)
	if first.Before(t0) {
		first = first.Add(time.Second)
	}
	var recs []api.Record
	total := 80e9
	for t := first; t.Before(t1); t = t.Add(time.Second) {
		for r := 0; r < f.Ranks; r++ {
			gpu, rank := r%max(f.GPUsPerNode, 1), r
			util := 97 - Spread(int64(t.Unix()), r)
			if r == f.Late {
				util = 71
			}
			recs = append(recs, api.Record{GPU: &api.GPU{Kind: api.KindGPU, Time: api.T(t), Host: f.Host(r), GPU: &gpu,
				RunID: f.ID, Rank: &rank, Name: "NVIDIA H100 80GB HBM3",
				UtilPct: api.F(util), MemUsedBytes: api.F(61e9 + float64(r%8)*1e8), MemTotalBytes: &[]api.Float{api.Float(total)}[0],
				PowerW: api.F(612 - Spread(int64(t.Unix()), r)), TempC: api.F(64), SMClockMHz: api.F(1980)}})
		}
	}
	return recs
}

// ms4 rounds to four decimals of a millisecond, as the hook sends.
func ms4(v float64) float64 { return round(v, 4) }

// round rounds v to decimals decimal places.
func round(v float64, decimals int) float64 {
	k := math.Pow(10, float64(decimals))
	return math.Round(v*k) / k
}
