package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// validate checks a decoded record against the limits of its kind, one
// check method per kind below, and returns the first problem found as a
// *RecordError naming the field, or nil. Both decoders call it, so a
// record the fast path decodes is held to the same rules.
func validate(rec Record) *RecordError {
	v := &validator{}
	switch {
	case rec.Run != nil:
		v.checkRun(rec.Run)
	case rec.Step != nil:
		v.checkStep(rec.Step)
	case rec.Layers != nil:
		v.checkLayers(rec.Layers)
	case rec.Eval != nil:
		v.checkEval(rec.Eval)
	case rec.GPU != nil:
		v.checkGPU(rec.GPU)
	case rec.Host != nil:
		v.checkHost(rec.Host)
	case rec.Memory != nil:
		v.checkMemory(rec.Memory)
	case rec.Event != nil:
		v.checkEvent(rec.Event)
	case rec.End != nil:
		v.checkEnd(rec.End)
	case rec.Process != nil:
		v.checkProcess(rec.Process)
	}
	return v.err
}

// checkRun checks a run record: its run id (required), project, sweep id
// and name; config and params as JSON objects; the code snapshot's size,
// which the hook cuts and flags, with no NUL and no negative byte count;
// the tags as identifiers, at most MaxTags; and the meta, typed fields in
// range and the whole as it will be stored (see meta).
func (v *validator) checkRun(r *Run) {
	v.id("run_id", r.RunID, true)
	v.id("project", r.Project, false)
	v.text("name", r.Name)
	v.object("config", r.Config)
	v.object("params", r.Params)
	v.id("sweep_id", r.SweepID, false)
	if c := r.Code; c != nil {
		v.text("code.entry_path", c.EntryPath)
		if len(c.Source) > MaxCodeText {
			v.fail("code.source", fmt.Sprintf("longer than %d bytes: cut it and set source_truncated", MaxCodeText))
		}
		if len(c.GitDiff) > MaxCodeText {
			v.fail("code.git_diff", fmt.Sprintf("longer than %d bytes: cut it and set git_diff_truncated", MaxCodeText))
		}
		if strings.ContainsRune(c.Source, 0) || strings.ContainsRune(c.GitDiff, 0) {
			v.fail("code", "holds a NUL character: send text")
		}
		if c.SourceBytes < 0 || c.GitDiffBytes < 0 {
			v.fail("code", "byte counts must not be negative")
		}
	}
	if len(r.Tags) > MaxTags {
		v.fail("tags", fmt.Sprintf("more than %d tags", MaxTags))
	}
	for i, t := range r.Tags {
		if msg := idProblem(t, true); msg != "" {
			v.fail(fmt.Sprintf("tags[%d]", i), msg)
		}
	}
	if r.Meta != nil {
		m := r.Meta
		v.nonNegInt("meta.zero_stage", m.ZeroStage)
		if m.ZeroStage != nil && *m.ZeroStage > 3 {
			v.fail("meta.zero_stage", "want 0, 1, 2 or 3")
		}
		v.nonNegInt("meta.world_size", m.WorldSize)
		v.nonNegInt("meta.micro_batch", m.MicroBatch)
		v.nonNegInt("meta.grad_accum", m.GradAccum)
		v.nonNegInt("meta.pipeline_stages", m.PipelineStages)
		if m.Params != nil && *m.Params < 0 {
			v.fail("meta.params", "negative")
		}
		if m.TotalSteps != nil && (*m.TotalSteps < 0 || *m.TotalSteps > MaxStep) {
			v.fail("meta.total_steps", fmt.Sprintf("want 0 to %d", int64(MaxStep)))
		}
		v.text("meta.command", m.Command)
		v.id("meta.model", m.Model, false)
		v.id("meta.precision", m.Precision, false)
		if len(m.Versions) > MaxMetrics {
			v.fail("meta.versions", "too many entries")
		}
		v.meta(m)
	}
}

// checkStep checks a step record: its run id (required), rank and step
// (required) in range, the user metrics' names and count, no negative
// duration, and no negative sample, token or sync count.
func (v *validator) checkStep(s *Step) {
	v.id("run_id", s.RunID, true)
	v.rank("rank", s.Rank)
	v.step("step", s.Step, true)
	v.metrics("metrics", s.Metrics)
	v.stepFields(s)
}

// checkLayers checks a layers record: its run id (required), rank and
// step (required); between 1 and MaxLayers layer names, each an
// identifier, with one forward time per name and either no backward
// times or one per name.
func (v *validator) checkLayers(l *Layers) {
	v.id("run_id", l.RunID, true)
	v.rank("rank", l.Rank)
	v.step("step", l.Step, true)
	switch {
	case len(l.Names) == 0:
		v.fail("names", "missing or empty")
	case len(l.Names) > MaxLayers:
		v.fail("names", fmt.Sprintf("more than %d layers", MaxLayers))
	case len(l.ForwardMS) != len(l.Names):
		v.fail("forward_ms", fmt.Sprintf("has %d entries, names has %d", len(l.ForwardMS), len(l.Names)))
	case len(l.BackwardMS) != 0 && len(l.BackwardMS) != len(l.Names):
		v.fail("backward_ms", fmt.Sprintf("has %d entries, names has %d", len(l.BackwardMS), len(l.Names)))
	}
	for i, n := range l.Names {
		if msg := idProblem(n, true); msg != "" {
			v.fail(fmt.Sprintf("names[%d]", i), msg)
		}
	}
}

// checkEval checks an eval record: its run id (required), step
// (required), split, and the user metrics' names and count.
func (v *validator) checkEval(e *Eval) {
	v.id("run_id", e.RunID, true)
	v.step("step", e.Step, true)
	v.id("split", e.Split, false)
	v.metrics("metrics", e.Metrics)
}

// checkGPU checks a GPU sample: its host (required), time (required) and
// GPU index (required, 0 to 4096); uuid, name, run id and rank when
// given; at most 1024 processes, each run id an identifier.
func (v *validator) checkGPU(g *GPU) {
	v.id("host", g.Host, true)
	if g.Time == nil {
		v.fail("time", "missing")
	}
	if g.GPU == nil {
		v.fail("gpu", "missing")
	} else if *g.GPU < 0 || *g.GPU > 4096 {
		v.fail("gpu", "want an index from 0 to 4096")
	}
	v.id("uuid", g.UUID, false)
	v.id("name", g.Name, false)
	v.id("run_id", g.RunID, false)
	if g.Rank != nil {
		v.rank("rank", *g.Rank)
	}
	if len(g.Processes) > 1024 {
		v.fail("processes", "more than 1024 entries")
	}
	for i, p := range g.Processes {
		if msg := idProblem(p.RunID, false); msg != "" {
			v.fail(fmt.Sprintf("processes[%d].run_id", i), msg)
		}
	}
}

// checkHost checks a host sample: its host (required) and time
// (required); at most 1024 processes, each run id an identifier.
func (v *validator) checkHost(h *Host) {
	v.id("host", h.Host, true)
	if h.Time == nil {
		v.fail("time", "missing")
	}
	if len(h.Processes) > 1024 {
		v.fail("processes", "more than 1024 entries")
	}
	for i, p := range h.Processes {
		if msg := idProblem(p.RunID, false); msg != "" {
			v.fail(fmt.Sprintf("processes[%d].run_id", i), msg)
		}
	}
}

// checkMemory checks a memory breakdown: its run id (required) and rank,
// each byte figure a non-negative number (NaN is refused), and the
// devices as identifiers.
func (v *validator) checkMemory(m *Memory) {
	v.id("run_id", m.RunID, true)
	v.rank("rank", m.Rank)
	for _, f := range []struct {
		name string
		val  *Float
	}{{"parameters_bytes", m.ParametersBytes}, {"gradients_bytes", m.GradientsBytes}, {"optimizer_bytes", m.OptimizerBytes}, {"activations_bytes", m.ActivationsBytes}} {
		if f.val != nil && !(float64(*f.val) >= 0) {
			v.fail(f.name, "want a non-negative number")
		}
	}
	v.id("optimizer_device", m.OptimizerDevice, false)
	v.id("parameters_device", m.ParametersDevice, false)
}

// checkEvent checks an event: its run id and type (both required), its
// text, and step and rank when given.
func (v *validator) checkEvent(e *Event) {
	v.id("run_id", e.RunID, true)
	v.id("type", e.Type, true)
	v.text("text", e.Text)
	v.step("step", e.Step, false)
	if e.Rank != nil {
		v.rank("rank", *e.Rank)
	}
}

// checkEnd checks an end record: its run id (required), a status of
// finished, failed or killed (required), and the summary as a JSON
// object.
func (v *validator) checkEnd(e *End) {
	v.id("run_id", e.RunID, true)
	switch e.Status {
	case StatusFinished, StatusFailed, StatusKilled:
	case "":
		v.fail("status", "missing (want finished, failed or killed)")
	default:
		v.fail("status", fmt.Sprintf("unknown status %q (want finished, failed or killed)", truncate(e.Status, 40)))
	}
	v.object("summary", e.Summary)
}

// checkProcess checks a process record: its run id (required), rank and
// local rank in range, and a positive pid.
func (v *validator) checkProcess(p *Process) {
	v.id("run_id", p.RunID, true)
	v.rank("rank", p.Rank)
	v.rank("local_rank", p.LocalRank)
	if p.PID <= 0 {
		v.fail("pid", "want a positive process id")
	}
}

// validator collects the first problem of a record: each check after it
// is a no-op for the answer.
type validator struct{ err *RecordError }

func (v *validator) fail(field, msg string) {
	if v.err == nil {
		v.err = &RecordError{Field: field, Msg: msg}
	}
}

func (v *validator) id(field, s string, required bool) {
	if msg := idProblem(s, required); msg != "" {
		v.fail(field, msg)
	}
}

// idProblem says what is wrong with an identifier, or "" when nothing is.
// Callers name the field only on failure, so that checking the 26 names
// of a layers record builds no strings.
func idProblem(s string, required bool) string {
	switch {
	case s == "" && required:
		return "missing or empty"
	case len(s) > MaxIDLen:
		return fmt.Sprintf("longer than %d bytes", MaxIDLen)
	case !utf8.ValidString(s) || strings.ContainsRune(s, 0):
		return "not valid UTF-8 text"
	}
	return ""
}

func (v *validator) text(field, s string) {
	switch {
	case len(s) > MaxTextLen:
		v.fail(field, fmt.Sprintf("longer than %d bytes", MaxTextLen))
	case !utf8.ValidString(s) || strings.ContainsRune(s, 0):
		v.fail(field, "not valid UTF-8 text")
	}
}

func (v *validator) rank(field string, r int) {
	if r < 0 || r > MaxRank {
		v.fail(field, fmt.Sprintf("want 0 to %d, got %d", MaxRank, r))
	}
}

func (v *validator) step(field string, s *int64, required bool) {
	switch {
	case s == nil && required:
		v.fail(field, "missing")
	case s != nil && (*s < 0 || *s > MaxStep):
		v.fail(field, fmt.Sprintf("want 0 to %d, got %d", int64(MaxStep), *s))
	}
}

func (v *validator) nonNegInt(field string, p *int) {
	if p != nil && *p < 0 {
		v.fail(field, "negative")
	}
}

func (v *validator) object(field string, raw json.RawMessage) {
	if len(raw) == 0 || string(raw) == "null" {
		return
	}
	if len(raw) > MaxJSONObject {
		v.fail(field, fmt.Sprintf("larger than %d bytes", MaxJSONObject))
		return
	}
	if bytes.TrimSpace(raw)[0] != '{' {
		v.fail(field, "want a JSON object")
	}
	if msg := JSONProblem(raw); msg != "" {
		v.fail(field, "holds "+msg)
	}
}

// meta checks the whole of a run's meta as it will be stored: its size,
// and every string and number in it, typed or not.
func (v *validator) meta(m *RunMeta) {
	if v.err != nil {
		return
	}
	for k, raw := range m.Extra {
		if msg := idProblem(k, true); msg != "" {
			v.fail("meta", "a key "+msg)
			return
		}
		if msg := JSONProblem(raw); msg != "" {
			v.fail("meta."+k, "holds "+msg)
			return
		}
	}
	js, err := json.Marshal(m)
	if err != nil {
		v.fail("meta", "cannot be stored: "+err.Error())
		return
	}
	if len(js) > MaxJSONObject {
		v.fail("meta", fmt.Sprintf("larger than %d bytes", MaxJSONObject))
		return
	}
	if msg := JSONProblem(js); msg != "" {
		v.fail("meta", "holds "+msg)
	}
}

func (v *validator) metrics(field string, m map[string]Float) {
	if len(m) > MaxMetrics {
		v.fail(field, fmt.Sprintf("more than %d entries", MaxMetrics))
	}
	for k := range m {
		if msg := idProblem(k, true); msg != "" {
			v.fail(field+"."+k, msg)
		}
	}
}
