package ingest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// ImportOptions names the run an export becomes.
type ImportOptions struct {
	// RunID of the run; empty derives one from a hash of the export, so
	// importing the same file again changes nothing.
	RunID   string
	Project string
	Name    string
	// Start is the run's start when the export's steps carry no times;
	// zero means now minus the export's total_time_minutes.
	Start time.Time
}

// ImportError says what is wrong with an export, and where.
type ImportError struct {
	Where string // "meta", "steps[12]", "evaluations[0]", …
	Field string
	Msg   string
}

func (e *ImportError) Error() string {
	s := e.Where
	if e.Field != "" {
		s += ": field " + e.Field
	}
	return s + ": " + e.Msg
}

// export is the seed dashboard's training_metrics.json, loosely typed
// because its field names vary between versions of the notebook.
type export struct {
	Meta        map[string]json.RawMessage   `json:"meta"`
	Steps       []map[string]json.RawMessage `json:"steps"`
	Evaluations []map[string]json.RawMessage `json:"evaluations"`
	ZeroMemory  map[string]json.RawMessage   `json:"zero_memory"`
}

// ExportRunID is the run id an export gets when none is given: a hash of
// its bytes, so a re-import lands on the same run.
func ExportRunID(body []byte) string {
	sum := sha256.Sum256(body)
	return "import-" + hex.EncodeToString(sum[:8])
}

// ParseExport turns a training_metrics.json export into the records of one
// complete run: the run, its steps with per-layer times, evaluations, the
// ZeRO memory breakdown and its end. Every record is validated as if it
// had come through POST /ingest.
func ParseExport(body []byte, opt ImportOptions) ([]api.Record, error) {
	var ex export
	if err := json.Unmarshal(api.NormalizeJSON(body), &ex); err != nil {
		return nil, &ImportError{Where: "export", Msg: "not a training_metrics.json object: " + err.Error()}
	}
	if len(ex.Steps) == 0 && len(ex.Evaluations) == 0 {
		return nil, &ImportError{Where: "export", Field: "steps", Msg: "missing or empty (want meta, steps, evaluations, zero_memory)"}
	}
	runID := opt.RunID
	if runID == "" {
		runID = ExportRunID(body)
	}
	p := &exportParser{runID: runID}
	meta := p.meta(ex.Meta, ex.ZeroMemory)
	if p.err != nil {
		return nil, p.err
	}

	// Step numbers and times: from the record when it has them; otherwise
	// spread over the run's total time (or a second a step) from Start.
	steps := make([]int64, len(ex.Steps))
	var maxStep int64
	for i, s := range ex.Steps {
		where := fmt.Sprintf("steps[%d]", i)
		n, ok := p.int(where, s, "step", "global_step")
		if !ok {
			n = int64(i)
		}
		steps[i] = n
		maxStep = max(maxStep, n)
	}
	total := p.float("meta", ex.Meta, "total_time_minutes")
	span := time.Duration(maxStep) * time.Second
	if total != nil && *total > 0 && !math.IsInf(*total, 0) {
		span = time.Duration(*total * float64(time.Minute))
	}
	times := make([]time.Time, len(ex.Steps))
	var first time.Time
	for i, s := range ex.Steps {
		times[i] = p.time(fmt.Sprintf("steps[%d]", i), s)
		if !times[i].IsZero() && (first.IsZero() || times[i].Before(first)) {
			first = times[i]
		}
	}
	start := opt.Start
	switch {
	case !first.IsZero():
		start = first
	case start.IsZero():
		start = api.Now().Add(-span).Truncate(time.Second)
	}
	timeOf := func(step int64) time.Time {
		if maxStep == 0 {
			return start
		}
		return start.Add(time.Duration(float64(span) * float64(step) / float64(maxStep)))
	}

	name := opt.Name
	if name == "" {
		name = meta.Model
	}
	recs := []api.Record{{Run: &api.Run{Kind: api.KindRun, RunID: runID, Project: opt.Project, Name: name,
		StartedAt: api.T(start), Meta: meta, Tags: []string{"imported"}}}}

	last := start
	stepRecs := make([]*api.Step, len(ex.Steps))
	for i, s := range ex.Steps {
		where := fmt.Sprintf("steps[%d]", i)
		t := times[i]
		if t.IsZero() {
			t = timeOf(steps[i])
		}
		if t.After(last) {
			last = t
		}
		st, layers := p.step(where, s, runID, steps[i], t)
		if p.err != nil {
			return nil, p.err
		}
		stepRecs[i] = st
		recs = append(recs, api.Record{Step: st})
		if layers != nil {
			recs = append(recs, api.Record{Layers: layers})
		}
	}
	deriveStepTimes(stepRecs, steps, times, meta)
	for i, e := range ex.Evaluations {
		where := fmt.Sprintf("evaluations[%d]", i)
		n, ok := p.int(where, e, "step", "global_step")
		if !ok {
			return nil, &ImportError{Where: where, Field: "step", Msg: "missing"}
		}
		t := p.time(where, e)
		if t.IsZero() {
			t = timeOf(n)
		}
		ev := &api.Eval{Kind: api.KindEval, RunID: runID, Step: &n, Time: api.T(t), Split: "val",
			Loss:     p.apiFloat(where, e, "val_loss", "loss"),
			Accuracy: p.apiFloat(where, e, "val_accuracy", "accuracy", "val_acc", "acc"),
			F1:       p.apiFloat(where, e, "val_f1", "f1"),
		}
		recs = append(recs, api.Record{Eval: ev})
	}
	if mem := p.memory(ex.ZeroMemory, runID, start); mem != nil {
		recs = append(recs, api.Record{Memory: mem})
	}
	if total != nil && *total > 0 && start.Add(span).After(last) {
		last = start.Add(span)
	}
	summary := map[string]json.RawMessage{}
	for _, k := range []string{"final_accuracy", "final_f1", "total_time_minutes", "final_loss"} {
		if v, ok := ex.Meta[k]; ok && string(v) != "null" {
			summary[k] = v
		}
	}
	end := &api.End{Kind: api.KindEnd, RunID: runID, Time: api.T(last), Status: api.StatusFinished}
	if len(summary) > 0 {
		end.Summary, _ = json.Marshal(summary)
	}
	recs = append(recs, api.Record{End: end})
	if p.err != nil {
		return nil, p.err
	}
	return validateRecords(recs)
}

// validateRecords runs every record through the ingest decoder, so an
// import obeys exactly the rules of POST /ingest.
func validateRecords(recs []api.Record) ([]api.Record, error) {
	out := make([]api.Record, 0, len(recs))
	for _, r := range recs {
		var v any
		switch {
		case r.Run != nil:
			v = r.Run
		case r.Step != nil:
			v = r.Step
		case r.Layers != nil:
			v = r.Layers
		case r.Eval != nil:
			v = r.Eval
		case r.Memory != nil:
			v = r.Memory
		case r.End != nil:
			v = r.End
		}
		js, err := json.Marshal(v)
		if err != nil {
			return nil, &ImportError{Where: r.Kind(), Msg: err.Error()}
		}
		rec, rerr := api.DecodeRecord(js)
		if rerr != nil {
			where := r.Kind()
			if r.Step != nil {
				where = fmt.Sprintf("steps (step %d)", *r.Step.Step)
			} else if r.Layers != nil {
				where = fmt.Sprintf("steps (step %d) layer_times", *r.Layers.Step)
			} else if r.Eval != nil {
				where = fmt.Sprintf("evaluations (step %d)", *r.Eval.Step)
			}
			return nil, &ImportError{Where: where, Field: rerr.Field, Msg: rerr.Msg}
		}
		out = append(out, rec)
	}
	return out, nil
}

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

func (h *Handler) importExport(c echo.Context) error {
	// The parsed export may keep parts of the body, so its buffers are
	// left to the collector rather than released for reuse.
	body, _, herr := h.readBody(c)
	if herr != nil {
		h.m.rejectedTotal("body").Inc()
		return c.JSON(herr.status, herr.body)
	}
	q := c.QueryParams()
	opt := ImportOptions{RunID: q.Get("run_id"), Project: q.Get("project"), Name: q.Get("name")}
	if opt.RunID == "" {
		opt.RunID = ExportRunID(body)
	}
	// A re-import of an export without step times must land on the same
	// times as the first one, or it would count as a resumed run.
	ctx, cancel := context.WithTimeout(c.Request().Context(), 10*time.Second)
	start, found, err := h.store.RunStartedAt(ctx, opt.RunID)
	cancel()
	if err != nil {
		return h.answerError(c, h.storeError(err, "read run"))
	}
	if found {
		opt.Start = start
	}
	// The run id of an export comes from its contents, so importing the
	// same file into another project names the same run: that would move
	// a run between projects unasked. It is refused; without a project
	// the run stays where it is.
	if found && opt.Project != "" {
		ctx, cancel := context.WithTimeout(c.Request().Context(), 10*time.Second)
		stored, _, err := h.store.RunProject(ctx, opt.RunID)
		cancel()
		if err != nil {
			return h.answerError(c, h.storeError(err, "read run"))
		}
		if stored != opt.Project {
			return c.JSON(http.StatusConflict, api.Error{Error: fmt.Sprintf(
				"run %s is already stored in project %q, nothing stored: import it again into %q (or with no project), or give it another run_id to store it as a second run in %q",
				opt.RunID, stored, stored, opt.Project)})
		}
	}
	recs, err := ParseExport(body, opt)
	if err != nil {
		h.m.rejectedTotal("body").Inc()
		var ie *ImportError
		if errors.As(err, &ie) {
			return c.JSON(http.StatusBadRequest, api.Error{Error: "invalid export, nothing stored: " + ie.Error(),
				Record: &api.RecordError{Kind: ie.Where, Field: ie.Field, Msg: ie.Msg}})
		}
		return c.JSON(http.StatusBadRequest, api.Error{Error: "invalid export, nothing stored: " + err.Error()})
	}
	res, herr := h.write(c.Request().Context(), recs)
	if herr != nil {
		return h.answerError(c, herr)
	}
	res.RunIDs = []string{opt.RunID}
	h.log.Info("imported export", "run_id", opt.RunID, "records", len(recs), "duplicates", res.Duplicates)
	return c.JSON(http.StatusOK, res)
}

func (h *Handler) storeError(err error, what string) *httpError {
	if store.IsDataError(err) {
		return &httpError{status: http.StatusBadRequest,
			body: api.Error{Error: what + ": the database refused a value, nothing stored: " + store.DataErrorMessage(err)}}
	}
	if store.IsUnavailable(err) {
		h.log.Warn("database unavailable, asking the sender to retry", "op", what, "err", err)
		return &httpError{status: http.StatusServiceUnavailable,
			body: api.Error{Error: fmt.Sprintf("database unavailable, retry in %d s", RetryAfterSeconds)}}
	}
	h.log.Error(what, "err", err)
	return &httpError{status: http.StatusInternalServerError, body: api.Error{Error: what + " failed"}}
}
