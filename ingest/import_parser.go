package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"sort"
	"time"

	"github.com/deepseed/deepseed/api"
)

// How an export's loosely typed parts become records: exportParser reads
// numbers, integers and times under any of their names in the notebook's
// versions, and converts a step (with its layer times), the meta and the
// ZeRO memory breakdown. ParseExport (import.go) puts them together.

type exportParser struct {
	runID string
	err   *ImportError
}

func (p *exportParser) fail(where, field, msg string) {
	if p.err == nil {
		p.err = &ImportError{Where: where, Field: field, Msg: msg}
	}
}

// raw returns the first of keys present and not null.
func raw(m map[string]json.RawMessage, keys ...string) (string, json.RawMessage) {
	for _, k := range keys {
		if v, ok := m[k]; ok && len(v) > 0 && string(v) != "null" {
			return k, v
		}
	}
	return "", nil
}

func (p *exportParser) apiFloat(where string, m map[string]json.RawMessage, keys ...string) *api.Float {
	k, v := raw(m, keys...)
	if v == nil {
		return nil
	}
	var f api.Float
	if err := json.Unmarshal(v, &f); err != nil {
		p.fail(where, k, "want a number, got "+abbrev(v))
		return nil
	}
	return &f
}

func (p *exportParser) float(where string, m map[string]json.RawMessage, keys ...string) *float64 {
	f := p.apiFloat(where, m, keys...)
	if f == nil {
		return nil
	}
	v := float64(*f)
	return &v
}

func (p *exportParser) int(where string, m map[string]json.RawMessage, keys ...string) (int64, bool) {
	k, v := raw(m, keys...)
	if v == nil {
		return 0, false
	}
	var f float64
	if err := json.Unmarshal(v, &f); err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		p.fail(where, k, "want an integer, got "+abbrev(v))
		return 0, false
	}
	return int64(f), true
}

func (p *exportParser) time(where string, m map[string]json.RawMessage) time.Time {
	k, v := raw(m, "time", "timestamp", "wall_time")
	if v == nil {
		return time.Time{}
	}
	var t api.Time
	if err := json.Unmarshal(v, &t); err != nil {
		p.fail(where, k, err.Error())
		return time.Time{}
	}
	return t.Time
}

func abbrev(v json.RawMessage) string {
	if len(v) > 40 {
		return string(v[:40]) + "…"
	}
	return string(v)
}

// stepKnown lists the keys of a step record that map onto typed fields;
// any other number is kept in the step's metrics.
var stepKnown = map[string]bool{}

func init() {
	for _, k := range []string{"step", "global_step", "time", "timestamp", "wall_time", "layer_times", "layers",
		"batch_size", "samples", "tokens", "epoch", "loss", "train_loss", "lr", "learning_rate", "grad_norm",
		"loss_scale", "throughput_sps", "samples_per_sec", "throughput", "throughput_tps", "tokens_per_sec",
		"step_ms", "step_time_ms", "forward_ms", "fwd_ms", "backward_ms", "bwd_ms", "optimizer_ms", "opt_ms",
		"comm_ms", "allreduce_ms", "data_ms", "data_load_ms", "dataload_ms", "gpu_util_pct", "gpu_util",
		"gpu_mem_used_gb", "gpu_memory_used_gb", "gpu_mem_peak_gb", "cpu_util_pct"} {
		stepKnown[k] = true
	}
}

func (p *exportParser) step(where string, m map[string]json.RawMessage, runID string, n int64, t time.Time) (*api.Step, *api.Layers) {
	fl := func(keys ...string) *api.Float { return p.apiFloat(where, m, keys...) }
	s := &api.Step{Kind: api.KindStep, RunID: runID, Step: &n, Time: api.T(t),
		Epoch:         fl("epoch"),
		Loss:          fl("loss", "train_loss"),
		LR:            fl("lr", "learning_rate"),
		GradNorm:      fl("grad_norm"),
		LossScale:     fl("loss_scale"),
		ThroughputSPS: fl("throughput_sps", "samples_per_sec", "throughput"),
		ThroughputTPS: fl("throughput_tps", "tokens_per_sec"),
		StepMS:        fl("step_ms", "step_time_ms"),
		ForwardMS:     fl("forward_ms", "fwd_ms"),
		BackwardMS:    fl("backward_ms", "bwd_ms"),
		OptimizerMS:   fl("optimizer_ms", "opt_ms"),
		CommMS:        fl("comm_ms", "allreduce_ms"),
		DataMS:        fl("data_ms", "data_load_ms", "dataload_ms"),
		GPUUtilPct:    fl("gpu_util_pct", "gpu_util"),
		GPUMemUsedGB:  fl("gpu_mem_used_gb", "gpu_memory_used_gb"),
		GPUMemPeakGB:  fl("gpu_mem_peak_gb"),
		CPUUtilPct:    fl("cpu_util_pct"),
	}
	if k, v := raw(m, "samples"); v != nil {
		if x, ok := p.int(where, m, k); ok {
			s.Samples = &x
		}
	}
	if k, v := raw(m, "tokens"); v != nil {
		if x, ok := p.int(where, m, k); ok {
			s.Tokens = &x
		}
	}
	// Any other number the notebook logged is kept as a named metric.
	var extra []string
	for k := range m {
		if !stepKnown[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(extra)
	for _, k := range extra {
		var f api.Float
		if json.Unmarshal(m[k], &f) == nil && len(s.Metrics) < api.MaxMetrics {
			if s.Metrics == nil {
				s.Metrics = map[string]api.Float{}
			}
			s.Metrics[k] = f
		}
	}
	_, lt := raw(m, "layer_times", "layers")
	if lt == nil {
		return s, nil
	}
	return s, p.layers(where+".layer_times", lt, runID, n, t)
}

// layers reads {name: {fwd_ms, bwd_ms}} (or forward_ms/backward_ms, or a
// plain number of forward milliseconds), keeping the object's key order:
// it is the model order the profiler registered its hooks in.
func (p *exportParser) layers(where string, v json.RawMessage, runID string, n int64, t time.Time) *api.Layers {
	kvs, err := orderedObject(v)
	if err != nil {
		p.fail(where, "", "want an object of layer name to timings: "+err.Error())
		return nil
	}
	if len(kvs) == 0 {
		return nil
	}
	l := &api.Layers{Kind: api.KindLayers, RunID: runID, Step: &n, Time: api.T(t)}
	var bwd []api.Float
	allBwd := true
	for _, kv := range kvs {
		var fwd, bw *api.Float
		var num api.Float
		if json.Unmarshal(kv.val, &num) == nil {
			fwd = &num
		} else {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(kv.val, &obj); err != nil {
				p.fail(where, kv.key, "want a number or {fwd_ms, bwd_ms}, got "+abbrev(kv.val))
				return nil
			}
			fwd = p.apiFloat(where+"."+kv.key, obj, "fwd_ms", "forward_ms", "fwd", "forward")
			bw = p.apiFloat(where+"."+kv.key, obj, "bwd_ms", "backward_ms", "bwd", "backward")
		}
		if fwd == nil {
			p.fail(where, kv.key, "no forward time (fwd_ms or forward_ms)")
			return nil
		}
		l.Names = append(l.Names, kv.key)
		l.ForwardMS = append(l.ForwardMS, *fwd)
		if bw == nil {
			allBwd = false
		} else {
			bwd = append(bwd, *bw)
		}
	}
	// Backward times go in only when every layer has one: the wire format
	// has no hole for a missing one.
	if allBwd {
		l.BackwardMS = bwd
	}
	return l
}

type keyVal struct {
	key string
	val json.RawMessage
}

func orderedObject(v json.RawMessage) ([]keyVal, error) {
	dec := json.NewDecoder(bytes.NewReader(v))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not an object")
	}
	var out []keyVal
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, err
		}
		out = append(out, keyVal{key, val})
	}
	return out, nil
}

// metaKnown are the export's meta keys that map onto typed RunMeta
// fields; the rest is kept as is.
var metaKnown = map[string]bool{"model": true, "params": true, "gpu": true, "gpu_memory_total_gb": true,
	"zero_stage": true, "fp16": true, "bf16": true, "precision": true, "batch_sizes": true, "epochs": true,
	"world_size": true}

func (p *exportParser) meta(m map[string]json.RawMessage, zero map[string]json.RawMessage) *api.RunMeta {
	meta := &api.RunMeta{Framework: "deepspeed"}
	str := func(k string) string {
		var s string
		if v, ok := m[k]; ok {
			if err := json.Unmarshal(v, &s); err != nil && string(v) != "null" {
				p.fail("meta", k, "want a string, got "+abbrev(v))
			}
		}
		return s
	}
	intp := func(where string, obj map[string]json.RawMessage, keys ...string) *int {
		if n, ok := p.int(where, obj, keys...); ok {
			v := int(n)
			return &v
		}
		return nil
	}
	meta.Model = str("model")
	meta.GPU = str("gpu")
	meta.Precision = str("precision")
	if n, ok := p.int("meta", m, "params"); ok {
		meta.Params = &n
	}
	meta.GPUMemTotalGB = p.apiFloat("meta", m, "gpu_memory_total_gb")
	meta.ZeroStage = intp("meta", m, "zero_stage")
	meta.Epochs = intp("meta", m, "epochs")
	meta.WorldSize = intp("meta", m, "world_size")
	if meta.WorldSize == nil {
		one := 1 // the seed notebook trains on one GPU
		meta.WorldSize = &one
	}
	if meta.Precision == "" {
		var fp16, bf16 bool
		_ = json.Unmarshal(m["fp16"], &fp16)
		_ = json.Unmarshal(m["bf16"], &bf16)
		switch {
		case bf16:
			meta.Precision = "bf16"
		case fp16:
			meta.Precision = "fp16"
		case m["fp16"] != nil:
			meta.Precision = "fp32"
		}
	}
	if _, v := raw(m, "batch_sizes"); v != nil {
		var bs map[string]json.RawMessage
		if err := json.Unmarshal(v, &bs); err != nil {
			p.fail("meta", "batch_sizes", "want an object {micro, grad_accum, effective}")
		} else {
			meta.MicroBatch = intp("meta.batch_sizes", bs, "micro", "micro_batch")
			meta.GradAccum = intp("meta.batch_sizes", bs, "grad_accum", "gradient_accumulation_steps")
			meta.EffectiveBatch = intp("meta.batch_sizes", bs, "effective", "global", "train_batch_size")
		}
	}
	// Offload as the hook reports it from a DeepSpeed config: cpu, nvme
	// or none. The export states where the optimizer state lives; it has
	// no parameter offload (ZeRO-3 only), so parameters stay on the GPU.
	meta.OffloadOptim, meta.OffloadParams = "none", "none"
	if _, v := raw(zero, "optimizer_cpu_gb"); v != nil {
		meta.OffloadOptim = "cpu"
	} else if _, v := raw(zero, "optimizer_nvme_gb"); v != nil {
		meta.OffloadOptim = "nvme"
	}
	for k, v := range m {
		if !metaKnown[k] {
			if meta.Extra == nil {
				meta.Extra = map[string]json.RawMessage{}
			}
			meta.Extra[k] = v
		}
	}
	return meta
}

// memory converts zero_memory (decimal gigabytes, as the notebook computes
// them) to a memory record in bytes.
func (p *exportParser) memory(z map[string]json.RawMessage, runID string, t time.Time) *api.Memory {
	if len(z) == 0 {
		return nil
	}
	gb := func(keys ...string) *api.Float {
		f := p.apiFloat("zero_memory", z, keys...)
		if f == nil {
			return nil
		}
		// Whole bytes: 4.022 GB is 4022000000, not 4022000000.0000005.
		return api.F(math.Round(float64(*f) * 1e9))
	}
	m := &api.Memory{Kind: api.KindMemory, RunID: runID, Time: api.T(t),
		ParametersBytes:  gb("parameters_gb", "params_gb"),
		GradientsBytes:   gb("gradients_gb", "grads_gb"),
		ActivationsBytes: gb("activations_gb"),
		OptimizerDevice:  "gpu",
	}
	if f := gb("optimizer_cpu_gb"); f != nil {
		m.OptimizerBytes = f
		m.OptimizerDevice = "cpu"
	} else if f := gb("optimizer_nvme_gb"); f != nil {
		m.OptimizerBytes = f
		m.OptimizerDevice = "nvme"
	} else {
		m.OptimizerBytes = gb("optimizer_gb", "optimizer_states_gb")
	}
	return m
}
