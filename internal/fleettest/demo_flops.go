package fleettest

import "github.com/deepseed/deepseed/api"

// Transformer shapes (layers, width) of the demo's models, for the
// attention term of the FLOPs per token, as the hook computes it.
var modelShapes = map[string][2]int{
	"bert-large-uncased":     {24, 1024},
	"EleutherAI/pythia-160m": {12, 768},
	"EleutherAI/pythia-410m": {24, 1024},
	"EleutherAI/pythia-1b":   {16, 2048},
}

// demoPeaks are the dense datasheet peaks (TFLOP/s) of the demo's GPUs,
// the hook's table for them.
var demoPeaks = map[string]map[string]float64{
	"Tesla T4":              {"fp16": 65, "fp32": 8.1},
	"NVIDIA H100 80GB HBM3": {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9},
}

// setFlops puts the run's FLOPs per token and GPU peak in its meta: 6 ×
// parameters plus 12 × layers × width × sequence length.
func setFlops(m *api.RunMeta, seqLen int) {
	if m.Params == nil {
		return
	}
	fpt := 6 * float64(*m.Params)
	if sh, ok := modelShapes[m.Model]; ok {
		fpt += 12 * float64(sh[0]) * float64(sh[1]) * float64(seqLen)
	}
	m.FlopsPerToken = api.F(fpt)
	if p, ok := demoPeaks[m.GPU][m.Precision]; ok {
		m.PeakTFLOPS = api.F(p)
	}
}

// withFlops gives a step its TFLOP/s and MFU from its tokens and time.
func withFlops(s *api.Step, m api.RunMeta) {
	if m.FlopsPerToken == nil || s.Tokens == nil || s.StepMS == nil || *s.StepMS <= 0 {
		return
	}
	tf := float64(*m.FlopsPerToken) * float64(*s.Tokens) / (float64(*s.StepMS) / 1000) / 1e12
	s.TFLOPS = api.F(tf)
	if m.PeakTFLOPS != nil && *m.PeakTFLOPS > 0 {
		s.MFU = api.F(tf / float64(*m.PeakTFLOPS))
	}
}

// code is the entry script and uncommitted diff the hook would send with
// the run, as the Training run dashboard's code panel shows them.
func (r *DemoRun) code() *api.RunCode {
	script := "deepspeed_bert_colab.py"
	if r.kind != "bert" {
		script = "train_pythia.py"
	}
	src := "import deepspeed, deepseed\n" +
		"from transformers import AutoModelForSequenceClassification\n\n" +
		"run = deepseed.init(project=\"demo\", config=\"ds_config.json\")\n" +
		"model = AutoModelForSequenceClassification.from_pretrained(\"" + r.Meta.Model + "\")\n" +
		"engine, opt, _, _ = deepspeed.initialize(model=model, config=\"ds_config.json\")\n" +
		"run.watch(engine)\n" +
		"for step, batch in enumerate(loader):\n" +
		"    loss = engine(**batch).loss\n" +
		"    engine.backward(loss)\n" +
		"    engine.step()\n"
	diff := "diff --git a/ds_config.json b/ds_config.json\n" +
		"--- a/ds_config.json\n+++ b/ds_config.json\n@@ -3 +3 @@\n" +
		"-  \"gradient_accumulation_steps\": 2,\n+  \"gradient_accumulation_steps\": 4,\n"
	return &api.RunCode{EntryPath: script, Source: src, SourceBytes: int64(len(src)),
		GitDiff: diff, GitDiffBytes: int64(len(diff))}
}
