package demo

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/deepseed/deepseed/api"
)

// Project is the project every simulated run belongs to.
const Project = "demo"

// Run is one simulated run.
type Run struct {
	ID      string
	Name    string
	Sweep   string
	Start   time.Time
	Ranks   int
	Steps   int64 // last step
	Every   int64 // steps between records
	Meta    api.RunMeta
	Config  map[string]any
	Params  map[string]any
	Figures Figures
	Layers  []string
	// LayerMS are the steady forward milliseconds of each layer; backward
	// is about twice as long.
	LayerMS []float64
	Seed    uint64
	kind    string // "bert" or "pythia"
	node    *node  // the host whose GPUs the run's ranks hold, GPU i for rank i
	// idleFrom, when not zero, starts the node's idle samples before the
	// run (the first run on its node); idleTo ends those after it, where
	// the next run on the node or the timeline begins.
	idleFrom, idleTo time.Time
}

// Figures are a run's steady-state targets, as the report's tables give
// them.
type Figures struct {
	GPUMemMB    float64
	GPUUtilPct  float64
	CPUUtilPct  float64
	StepTimeS   float64
	StepsPerSec float64
}

// Table is one of the report's comparison tables: the sweep holding its
// runs and the figures of each row, in order.
type Table struct {
	Number int
	Sweep  string
	Rows   []TableRow
}

// TableRow is one row of a report table.
type TableRow struct {
	Label string
	RunID string
	Figures
}

// span is how long before the anchor the first simulated run starts: the
// BERT run, then the pythia runs two hours apart a day later, and last a
// short H100 run that ends just before the anchor's hour, so that a fresh
// load shows in the last few hours too.
const span = 48 * time.Hour

// h100Lead is how long before the end of the timeline the H100 run starts.
const h100Lead = 32 * time.Minute

// Epoch is the start of the first simulated run when the demo's timeline
// ends at anchor (truncated to the hour, so that loads within one hour
// write identical records).
func Epoch(anchor time.Time) time.Time { return anchor.UTC().Truncate(time.Hour).Add(-span) }

// Tables returns tables 2, 5, 7, 9 and 10 of the experiment report as the
// demo's pythia runs reproduce them.
func Tables() []Table {
	return []Table{
		{2, "pythia-zero-stages", []TableRow{
			{"Stage 1", "demo-pythia-160m-zero1", Figures{6940.2, 77.7, 44.6, 0.89, 1.12}},
			{"Stage 2", "demo-pythia-160m-zero2", Figures{6966.9, 74.5, 41.5, 0.93, 1.08}},
			{"Stage 3", "demo-pythia-160m-zero3", Figures{8433.3, 93.0, 53.1, 0.804, 1.24}},
		}},
		{5, "pythia-precision", []TableRow{
			{"FP32", "demo-pythia-160m-fp32", Figures{6954.5, 83.7, 46.5, 0.89, 1.12}},
			{"FP16", "demo-pythia-160m-fp16", Figures{4528.8, 83.5, 47.1, 0.34, 2.98}},
			{"BF16", "demo-pythia-160m-bf16", Figures{6241.6, 79.0, 44.2, 1.06, 0.94}},
		}},
		{7, "pythia-parallelism", []TableRow{
			{"Model Parallelism", "demo-pythia-160m-pipeline", Figures{5793.1, 88.3, 53.6, 0.295, 3.39}},
			{"Data Parallelism", "demo-pythia-160m-data", Figures{8433.3, 93.0, 53.2, 0.806, 1.24}},
		}},
		{9, "pythia-offload", []TableRow{
			{"Offload to CPU", "demo-pythia-160m-offload", Figures{3714.0, 20.5, 52.5, 1.2426, 0.80}},
			{"No Offload", "demo-pythia-160m-no-offload", Figures{8433.3, 93.0, 53.2, 1.2420, 1.24}},
		}},
		{10, "pythia-410m", []TableRow{
			{"Training Progress", "demo-pythia-410m-zero3-offload-bf16-pipeline", Figures{8133.5, 55.4, 53.1, 3.46, 1 / 3.46}},
		}},
	}
}

// pythiaSetup is the configuration of each pythia run.
type pythiaSetup struct {
	model     string
	params    int64
	stage     int
	precision string
	pipeline  int
	micro     int
	offload   bool
	// The H100 run's: gradient accumulation and steps (zero: 1, and the
	// report's), on what node (nil: the two-T4 node).
	accum, steps int
	node         *node
}

var pythiaSetups = map[string]pythiaSetup{
	"demo-pythia-160m-zero1":                       {"EleutherAI/pythia-160m", 162322944, 1, "fp16", 0, 8, false, 0, 0, nil},
	"demo-pythia-160m-zero2":                       {"EleutherAI/pythia-160m", 162322944, 2, "fp16", 0, 8, false, 0, 0, nil},
	"demo-pythia-160m-zero3":                       {"EleutherAI/pythia-160m", 162322944, 3, "fp16", 0, 8, false, 0, 0, nil},
	"demo-pythia-160m-fp32":                        {"EleutherAI/pythia-160m", 162322944, 1, "fp32", 0, 8, false, 0, 0, nil},
	"demo-pythia-160m-fp16":                        {"EleutherAI/pythia-160m", 162322944, 1, "fp16", 0, 8, false, 0, 0, nil},
	"demo-pythia-160m-bf16":                        {"EleutherAI/pythia-160m", 162322944, 1, "bf16", 0, 8, false, 0, 0, nil},
	"demo-pythia-160m-pipeline":                    {"EleutherAI/pythia-160m", 162322944, 3, "fp16", 2, 1, false, 0, 0, nil},
	"demo-pythia-160m-data":                        {"EleutherAI/pythia-160m", 162322944, 3, "fp16", 0, 8, false, 0, 0, nil},
	"demo-pythia-160m-offload":                     {"EleutherAI/pythia-160m", 162322944, 3, "fp16", 0, 8, true, 0, 0, nil},
	"demo-pythia-160m-no-offload":                  {"EleutherAI/pythia-160m", 162322944, 3, "fp16", 0, 8, false, 0, 0, nil},
	"demo-pythia-410m-zero3-offload-bf16-pipeline": {"EleutherAI/pythia-410m", 405334016, 3, "bf16", 2, 4, true, 0, 0, nil},
}

// h100Row is a run beyond the report's tables: pythia-410m, ZeRO-1 bf16
// on four NVLink H100s, short and recent, so that the GPU-nodes charts of
// Hopper-only counters (NVLink, GPM) have data.
var (
	h100Row   = TableRow{"4×H100 NVLink", "demo-pythia-410m-zero1-bf16-h100", Figures{31240, 96.5, 12.5, 1.1, 1 / 1.1}}
	h100Setup = pythiaSetup{"EleutherAI/pythia-410m", 405334016, 1, "bf16", 0, 16, false, 4, 1300, h100x4}
)

// Runs returns every simulated run, on a timeline that ends at anchor: the
// BERT-large run of the seed dashboard, then the pythia runs of the
// report's tables. Dashboards look at recent time ranges, so the loader
// anchors the timeline at the time of the first load.
func Runs(anchor time.Time) []*Run {
	epoch := Epoch(anchor)
	end := epoch.Add(span)
	runs := []*Run{bertRun(epoch)}
	start := epoch.Add(24 * time.Hour)
	seed := uint64(100)
	for _, t := range Tables() {
		for _, row := range t.Rows {
			su := pythiaSetups[row.RunID]
			seed++
			runs = append(runs, pythiaRun(row, t, su, start, seed))
			start = start.Add(2 * time.Hour)
		}
	}
	runs = append(runs, pythiaRun(h100Row, Table{}, h100Setup, end.Add(-h100Lead), 200))
	// Each node idles between its runs: the first run on a node writes
	// ten idle minutes before it, each run the idle time after it up to a
	// minute before the next run on its node, the last the time up to the
	// end of the timeline (the Colab VM of the BERT run is gone a quarter
	// of an hour after it).
	last := map[*node]*Run{}
	for _, r := range runs {
		if p := last[r.node]; p != nil {
			p.idleTo = r.Start.Add(-time.Minute)
		} else {
			r.idleFrom = r.Start.Add(-10 * time.Minute)
		}
		last[r.node] = r
	}
	for n, r := range last {
		r.idleTo = end
		if n == colabT4 {
			r.idleTo = r.Start.Add(45 * time.Minute)
		}
	}
	return runs
}

func pythiaRun(row TableRow, t Table, su pythiaSetup, start time.Time, seed uint64) *Run {
	nd, accum := su.node, max(su.accum, 1)
	if nd == nil {
		nd = t4x2
	}
	ranks := len(nd.uuids)
	m := api.RunMeta{
		Model: su.model, Params: api.Ptr(su.params), GPU: nd.gpu, GPUMemTotalGB: api.F(nd.memTotal / 1e9),
		ZeroStage: api.Ptr(su.stage), Precision: su.precision, WorldSize: api.Ptr(ranks), MicroBatch: api.Ptr(su.micro),
		GradAccum: api.Ptr(accum), SeqLen: api.Ptr(512), Framework: "deepspeed", Parallelism: "data",
		Command:   fmt.Sprintf("deepspeed --num_gpus=%d train_pythia.py --deepspeed ds_config.json", ranks),
		GitCommit: "5f1c2a9", Host: nd.host,
		Versions: map[string]string{"python": "3.10.12", "torch": "2.0.1", "deepspeed": "0.16.7", "cuda": "11.8"},
	}
	if nd.hopper {
		m.Versions = map[string]string{"python": "3.11.9", "torch": "2.4.1", "deepspeed": "0.16.7", "cuda": "12.4"}
	}
	setFlops(&m, 512)
	zero := map[string]any{"stage": su.stage}
	if su.offload {
		m.OffloadOptim, m.OffloadParams = "cpu", "cpu"
		zero["offload_optimizer"] = map[string]any{"device": "cpu", "pin_memory": true}
		zero["offload_param"] = map[string]any{"device": "cpu", "pin_memory": true}
	} else {
		m.OffloadOptim, m.OffloadParams = "none", "none"
	}
	cfg := map[string]any{
		"zero_optimization":              zero,
		"fp16":                           map[string]any{"enabled": su.precision == "fp16"},
		"bf16":                           map[string]any{"enabled": su.precision == "bf16"},
		"train_batch_size":               "auto",
		"train_micro_batch_size_per_gpu": "auto",
		"gradient_accumulation_steps":    "auto",
	}
	if su.pipeline > 1 {
		m.PipelineStages = api.Ptr(su.pipeline)
		m.Parallelism = "pipeline"
		cfg["pipeline"] = map[string]any{"enabled": true, "stages": su.pipeline, "micro_batch_size": su.micro, "intermediate_batch_size": "auto"}
	}
	layers := []string{"gpt_neox.embed_in"}
	n := 12
	if su.params > 300e6 {
		n = 24
	}
	for i := 0; i < n; i++ {
		layers = append(layers, fmt.Sprintf("gpt_neox.layers.%d", i))
	}
	layers = append(layers, "embed_out")
	// Forward is about a third of the step; spread it over the layers.
	fwd := row.StepTimeS * 1000 * 0.3
	lms := make([]float64, len(layers))
	for i := range layers {
		switch {
		case i == 0:
			lms[i] = fwd * 0.04
		case i == len(layers)-1:
			lms[i] = fwd * 0.08
		default:
			lms[i] = fwd * 0.88 / float64(n) * (0.95 + 0.1*float64(i%3)/2)
		}
	}
	steps := int64(300)
	if t.Number == 10 {
		steps = 150
	}
	if su.steps > 0 {
		steps = int64(su.steps)
	}
	params := map[string]any{"lr": 6e-4, "warmup_steps": 10, "weight_decay": 0.1, "dataset": "wikitext-103"}
	if t.Number != 0 {
		params["report_table"] = t.Number
	}
	return &Run{
		ID: row.RunID, Name: fmt.Sprintf("%s %s (simulated)", shortModel(su.model), row.Label), Sweep: t.Sweep,
		Start: start, Ranks: ranks, Steps: steps, Every: 1, Meta: m, Config: cfg,
		Params: params, Figures: row.Figures, Layers: layers, LayerMS: lms, Seed: seed, kind: "pythia", node: nd,
	}
}

func shortModel(m string) string {
	for i := len(m) - 1; i >= 0; i-- {
		if m[i] == '/' {
			return m[i+1:]
		}
	}
	return m
}

func bertRun(epoch time.Time) *Run {
	layers := []string{"embeddings"}
	lms := []float64{1.5}
	for i := 0; i < 24; i++ {
		layers = append(layers, fmt.Sprintf("encoder.%d", i))
		// Encoder layers take 1.8–2.4 ms, later layers a little longer.
		lms = append(lms, 1.8+0.6*float64(i)/23)
	}
	layers = append(layers, "classifier")
	lms = append(lms, 0.4)
	m := api.RunMeta{
		Model: "bert-large-uncased", Params: api.Ptr(int64(335141890)), GPU: "Tesla T4", GPUMemTotalGB: api.F(15.8),
		ZeroStage: api.Ptr(2), Precision: "fp16", WorldSize: api.Ptr(1), MicroBatch: api.Ptr(4), GradAccum: api.Ptr(4),
		EffectiveBatch: api.Ptr(16), OffloadOptim: "cpu", OffloadParams: "none", Parallelism: "data",
		SeqLen: api.Ptr(256), Epochs: api.Ptr(3), Framework: "deepspeed",
		Command:   "python deepspeed_bert_colab.py --deepspeed ds_config.json",
		GitCommit: "9e3b7d1", Host: "colab-t4",
		Versions: map[string]string{"python": "3.10.12", "torch": "2.1.0+cu118", "deepspeed": "0.12.6", "transformers": "4.35.2", "cuda": "11.8"},
	}
	setFlops(&m, 256)
	cfg := map[string]any{
		"train_micro_batch_size_per_gpu": 4,
		"gradient_accumulation_steps":    4,
		"optimizer": map[string]any{"type": "AdamW", "params": map[string]any{
			"lr": 2e-5, "betas": []float64{0.9, 0.999}, "eps": 1e-8, "weight_decay": 0.01}},
		"scheduler": map[string]any{"type": "WarmupDecayLR", "params": map[string]any{
			"warmup_min_lr": 0, "warmup_max_lr": 2e-5, "warmup_num_steps": 150, "total_num_steps": 2400}},
		"fp16": map[string]any{"enabled": true, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000},
		"zero_optimization": map[string]any{
			"stage": 2, "offload_optimizer": map[string]any{"device": "cpu", "pin_memory": true},
			"allgather_partitions": true, "allgather_bucket_size": 2e8, "overlap_comm": true,
			"reduce_scatter": true, "reduce_bucket_size": 2e8, "contiguous_gradients": true},
		"gradient_clipping":    1.0,
		"wall_clock_breakdown": true,
		"steps_per_print":      50,
	}
	return &Run{
		ID: "demo-bert-large-zero2-fp16-offload", Name: "bert-large IMDB ZeRO-2 fp16 CPU offload (simulated)",
		Start: epoch, Ranks: 1, Steps: 2300, Every: 5, Meta: m, Config: cfg,
		Params: map[string]any{"lr": 2e-5, "warmup_steps": 150, "epochs": 3, "max_seq_len": 256, "dataset": "imdb",
			"log_every": 5, "eval_every": 200},
		Layers: layers, LayerMS: lms, Seed: 7, kind: "bert", node: colabT4,
	}
}

// Records returns the run's records in the order a training job would
// send them: the run, then its steps, layers, evaluations, events and
// samples, then its end.
func (r *Run) Records() []any {
	if r.kind == "bert" {
		return r.bertRecords()
	}
	return r.pythiaRecords()
}

func (r *Run) runRecord() *api.Run {
	cfg, _ := json.Marshal(r.Config)
	params, _ := json.Marshal(r.Params)
	m := r.Meta
	return &api.Run{Kind: api.KindRun, RunID: r.ID, Project: Project, Name: r.Name, StartedAt: api.T(r.Start),
		Config: cfg, Meta: &m, Params: params, Tags: []string{"simulated", "demo"}, SweepID: r.Sweep, Code: r.code()}
}

// jitter returns ±a, alternating with i, so that any long enough run of
// steps averages to the exact target.
func jitter(i int64, a float64) float64 {
	if i%2 == 0 {
		return a
	}
	return -a
}

func (r *Run) pythiaRecords() []any {
	rng := rand.New(rand.NewPCG(r.Seed, 0x5eed))
	f := r.Figures
	out := []any{r.runRecord()}
	interval := time.Duration(float64(time.Second) / f.StepsPerSec)
	const warmup = 10
	var last time.Time
	for rank := 0; rank < r.Ranks; rank++ {
		t := r.Start.Add(20 * time.Second) // model load
		for i := int64(0); i <= r.Steps; i++ {
			stepMS := f.StepTimeS * 1000 * (1 + jitter(i+int64(rank), 0.004))
			mem := f.GPUMemMB / 1000
			util := f.GPUUtilPct + jitter(i+int64(rank), 2)
			cpu := f.CPUUtilPct + jitter(i+int64(rank), 1.5)
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
			lastLate := 0.0
			for k := 0; k < r.Ranks; k++ {
				lastLate = math.Max(lastLate, demoLate(k, i))
			}
			late := demoLate(rank, i)
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
func (r *Run) pythiaLoad(interval time.Duration, last, end time.Time) load {
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
	l := load{util: f.GPUUtilPct, memBytes: f.GPUMemMB * 1e6 * 1.01, busyFrom: r.Start.Add(20 * time.Second), busyTo: last, end: end,
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
func (r *Run) layers(rank int, step int64, t time.Time, slow float64, rng *rand.Rand) *api.Layers {
	f := make([]api.Float, len(r.Layers))
	b := make([]api.Float, len(r.Layers))
	for j, ms := range r.LayerMS {
		v := ms * slow * (1 + 0.04*rng.NormFloat64())
		f[j] = api.Float(v)
		b[j] = api.Float(v * (1.9 + 0.1*rng.Float64()))
	}
	return &api.Layers{Kind: api.KindLayers, RunID: r.ID, Rank: rank, Step: api.Ptr(step), Time: api.T(t),
		Names: r.Layers, ForwardMS: f, BackwardMS: b}
}

func (r *Run) memoryRecord() *api.Memory {
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

func (r *Run) bertRecords() []any {
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
	l := load{util: 91, memBytes: 10.65e9, busyFrom: stepTimes[0].Add(-3 * time.Second), busyTo: end, end: end.Add(30 * time.Second),
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
func demoLate(rank int, i int64) float64 { return 1 + jitter(i*31+int64(rank)*7, 1) }
