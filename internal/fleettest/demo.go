package fleettest

import (
	"fmt"
	"time"

	"github.com/deepseed/deepseed/api"
)

// DemoProject is the project every simulated run belongs to.
const DemoProject = "demo"

// DemoRun is one simulated run of deepseed demo; its Records are what the
// demo posts for it.
type DemoRun struct {
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
	Figures DemoFigures
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

// DemoFigures are a run's steady-state targets, as the report's tables give
// them.
type DemoFigures struct {
	GPUMemMB    float64
	GPUUtilPct  float64
	CPUUtilPct  float64
	StepTimeS   float64
	StepsPerSec float64
}

// DemoTable is one of the report's comparison tables: the sweep holding its
// runs and the figures of each row, in order.
type DemoTable struct {
	Number int
	Sweep  string
	Rows   []DemoTableRow
}

// DemoTableRow is one row of a report table.
type DemoTableRow struct {
	Label string
	RunID string
	DemoFigures
}

// demoSpan is how long before the anchor the first simulated run starts: the
// BERT run, then the pythia runs two hours apart a day later, and last a
// short H100 run that ends just before the anchor's hour, so that a fresh
// load shows in the last few hours too.
const demoSpan = 48 * time.Hour

// h100Lead is how long before the end of the timeline the H100 run starts.
const h100Lead = 32 * time.Minute

// DemoEpoch is the start of the first simulated run when the demo's timeline
// ends at anchor (truncated to the hour, so that loads within one hour
// write identical records).
func DemoEpoch(anchor time.Time) time.Time { return anchor.UTC().Truncate(time.Hour).Add(-demoSpan) }

// DemoTables returns tables 2, 5, 7, 9 and 10 of the experiment report as the
// demo's pythia runs reproduce them.
func DemoTables() []DemoTable {
	return []DemoTable{
		{2, "pythia-zero-stages", []DemoTableRow{
			{"Stage 1", "demo-pythia-160m-zero1", DemoFigures{6940.2, 77.7, 44.6, 0.89, 1.12}},
			{"Stage 2", "demo-pythia-160m-zero2", DemoFigures{6966.9, 74.5, 41.5, 0.93, 1.08}},
			{"Stage 3", "demo-pythia-160m-zero3", DemoFigures{8433.3, 93.0, 53.1, 0.804, 1.24}},
		}},
		{5, "pythia-precision", []DemoTableRow{
			{"FP32", "demo-pythia-160m-fp32", DemoFigures{6954.5, 83.7, 46.5, 0.89, 1.12}},
			{"FP16", "demo-pythia-160m-fp16", DemoFigures{4528.8, 83.5, 47.1, 0.34, 2.98}},
			{"BF16", "demo-pythia-160m-bf16", DemoFigures{6241.6, 79.0, 44.2, 1.06, 0.94}},
		}},
		{7, "pythia-parallelism", []DemoTableRow{
			{"Model Parallelism", "demo-pythia-160m-pipeline", DemoFigures{5793.1, 88.3, 53.6, 0.295, 3.39}},
			{"Data Parallelism", "demo-pythia-160m-data", DemoFigures{8433.3, 93.0, 53.2, 0.806, 1.24}},
		}},
		{9, "pythia-offload", []DemoTableRow{
			{"Offload to CPU", "demo-pythia-160m-offload", DemoFigures{3714.0, 20.5, 52.5, 1.2426, 0.80}},
			{"No Offload", "demo-pythia-160m-no-offload", DemoFigures{8433.3, 93.0, 53.2, 1.2420, 1.24}},
		}},
		{10, "pythia-410m", []DemoTableRow{
			{"Training Progress", "demo-pythia-410m-zero3-offload-bf16-pipeline", DemoFigures{8133.5, 55.4, 53.1, 3.46, 1 / 3.46}},
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
	h100Row   = DemoTableRow{"4×H100 NVLink", "demo-pythia-410m-zero1-bf16-h100", DemoFigures{31240, 96.5, 12.5, 1.1, 1 / 1.1}}
	h100Setup = pythiaSetup{"EleutherAI/pythia-410m", 405334016, 1, "bf16", 0, 16, false, 4, 1300, h100x4}
)

// DemoRuns returns every simulated run, on a timeline that ends at anchor: the
// BERT-large run of the seed dashboard, then the pythia runs of the
// report's tables. Dashboards look at recent time ranges, so the loader
// anchors the timeline at the time of the first load.
func DemoRuns(anchor time.Time) []*DemoRun {
	epoch := DemoEpoch(anchor)
	end := epoch.Add(demoSpan)
	runs := []*DemoRun{bertRun(epoch)}
	start := epoch.Add(24 * time.Hour)
	seed := uint64(100)
	for _, t := range DemoTables() {
		for _, row := range t.Rows {
			su := pythiaSetups[row.RunID]
			seed++
			runs = append(runs, pythiaRun(row, t, su, start, seed))
			start = start.Add(2 * time.Hour)
		}
	}
	runs = append(runs, pythiaRun(h100Row, DemoTable{}, h100Setup, end.Add(-h100Lead), 200))
	// Each node idles between its runs: the first run on a node writes
	// ten idle minutes before it, each run the idle time after it up to a
	// minute before the next run on its node, the last the time up to the
	// end of the timeline (the Colab VM of the BERT run is gone a quarter
	// of an hour after it).
	last := map[*node]*DemoRun{}
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

func pythiaRun(row DemoTableRow, t DemoTable, su pythiaSetup, start time.Time, seed uint64) *DemoRun {
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
	n := 12
	if su.params > 300e6 {
		n = 24
	}
	layers := layerNames("gpt_neox.embed_in", "gpt_neox.layers", n, "embed_out")
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
	return &DemoRun{
		ID: row.RunID, Name: fmt.Sprintf("%s %s (simulated)", shortModel(su.model), row.Label), Sweep: t.Sweep,
		Start: start, Ranks: ranks, Steps: steps, Every: 1, Meta: m, Config: cfg,
		Params: params, Figures: row.DemoFigures, Layers: layers, LayerMS: lms, Seed: seed, kind: "pythia", node: nd,
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

func bertRun(epoch time.Time) *DemoRun {
	layers := layerNames("embeddings", "encoder", 24, "classifier")
	lms := []float64{1.5}
	for i := range 24 {
		// Encoder layers take 1.8–2.4 ms, later layers a little longer.
		lms = append(lms, 1.8+0.6*float64(i)/23)
	}
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
	return &DemoRun{
		ID: "demo-bert-large-zero2-fp16-offload", Name: "bert-large IMDB ZeRO-2 fp16 CPU offload (simulated)",
		Start: epoch, Ranks: 1, Steps: 2300, Every: 5, Meta: m, Config: cfg,
		Params: map[string]any{"lr": 2e-5, "warmup_steps": 150, "epochs": 3, "max_seq_len": 256, "dataset": "imdb",
			"log_every": 5, "eval_every": 200},
		Layers: layers, LayerMS: lms, Seed: 7, kind: "bert", node: colabT4,
	}
}
