package fleettest

import (
	"math"
	"time"

	"github.com/deepseed/deepseed/api"
)

// Load is the run in the shape the ingest benchmark posts it (deepseed
// bench ingest, and ingest's benchmarks): a run shaped like the seed's,
// where every step brings one step and one layers record per rank and an
// evaluation follows every EvalEvery steps. Its ranks do not wait on an
// all-reduce; their figures spread by [Spread]'s pattern, a tenth of a
// millisecond at most.
type Load struct {
	RunID     string
	Ranks     int // 16 in the benchmarks
	Layers    int // 26: embeddings, encoder.0..23, classifier
	EvalEvery int // 200
	Start     time.Time
}

// LayerNames returns the run's layer names in model order.
func (l Load) LayerNames() []string { return namedLayers(l.Layers, "encoder", "classifier") }

// Records returns the records of steps [from, from+n).
func (l Load) Records(from, n int64) []api.Record {
	names := l.LayerNames()
	recs := make([]api.Record, 0, n*int64(2*l.Ranks)+n/int64(max(l.EvalEvery, 1))+1)
	for s := from; s < from+n; s++ {
		step := s
		at := l.Start.Add(time.Duration(s) * 550 * time.Millisecond)
		t := api.T(at)
		loss := 0.7*math.Exp(-float64(s)/1500) + 0.25
		for r := 0; r < l.Ranks; r++ {
			jitter := float64(spread(s, r)) / 1000
			recs = append(recs, api.Record{Step: &api.Step{Kind: api.KindStep, RunID: l.RunID, Rank: r, Step: &step, Time: t,
				Epoch: api.F(float64(s) / 1563), Loss: api.F(loss + jitter/10), LR: api.F(2e-5), GradNorm: api.F(0.6 + jitter),
				LossScale: api.F(65536), Samples: api.Ptr(s * 16), ThroughputSPS: api.F(23.5 + jitter), StepMS: api.F(ms4(172 + jitter)),
				ForwardMS: api.F(ms4(48 + jitter)), BackwardMS: api.F(ms4(92 + jitter)), OptimizerMS: api.F(ms4(28 + jitter)), CommMS: api.F(3.1),
				DataMS: api.F(4.2), GPUUtilPct: api.F(96), GPUMemUsedGB: api.F(10.5 + jitter)}})
			recs = append(recs, api.Record{Layers: layersRecord(l.RunID, r, s, at, names, func(i int) (float64, float64) {
				// Durations as the hook sends them: to 0.1 µs, what CUDA
				// events resolve.
				f := 1.8 + float64(i%7)/10 + jitter
				return ms4(f), ms4(f * 1.9)
			})})
		}
		if l.EvalEvery > 0 && s%int64(l.EvalEvery) == 0 {
			recs = append(recs, api.Record{Eval: &api.Eval{Kind: api.KindEval, RunID: l.RunID, Step: &step, Time: t,
				Split: "val", Loss: api.F(loss - 0.05), Accuracy: api.F(0.5 + 0.4*(1-math.Exp(-float64(s)/2000))), F1: api.F(0.8)}})
		}
	}
	return recs
}
