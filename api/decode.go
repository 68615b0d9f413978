package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// RecordError says which record of a batch is wrong, in which field, and
// how. Index is the zero-based position in a JSON array; Line is the
// one-based line of an NDJSON body (0 when the body was an array).
type RecordError struct {
	Index int    `json:"index"`
	Line  int    `json:"line,omitempty"`
	Kind  string `json:"kind,omitempty"`
	Field string `json:"field,omitempty"`
	Msg   string `json:"message"`
	// rows marks a record refused for the rows it expands to: the batch's
	// [RowsError], not a fault of the record.
	rows bool
}

func (e *RecordError) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d", e.Line)
	} else {
		fmt.Fprintf(&b, "record %d", e.Index)
	}
	if e.Kind != "" {
		fmt.Fprintf(&b, " (%s)", e.Kind)
	}
	if e.Field != "" {
		fmt.Fprintf(&b, ": field %s", e.Field)
	}
	b.WriteString(": ")
	b.WriteString(e.Msg)
	return b.String()
}

// ErrEmptyBatch is returned for a body with no records.
var ErrEmptyBatch = errors.New("batch holds no records")

// MaxBatchRecords bounds the records of one batch.
const MaxBatchRecords = 100000

// DecodeBatch decodes an ingest body: a JSON array of records or NDJSON (one
// record per line; blank lines are skipped). Bare NaN, Infinity and
// -Infinity are accepted. Every record is validated; the first bad one is
// returned as a *RecordError and no records are returned. The batch may
// expand to at most MaxBatchRecords rows (see [DecodeBatchWithin]).
func DecodeBatch(body []byte) ([]Record, error) {
	return DecodeBatchWithin(body, MaxBatchRecords)
}

// DecodeBatchWithin is [DecodeBatch] for a batch that may expand to at
// most maxRows rows (see [Record.Rows]; at most MaxBatchRecords). A batch
// past it is refused with a *RowsError as soon as the record that passes
// it is read, before that record's rows are built.
func DecodeBatchWithin(body []byte, maxRows int) ([]Record, error) {
	maxRows = min(max(maxRows, 1), MaxBatchRecords)
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 {
		return nil, ErrEmptyBatch
	}
	var fd fastDecoder
	if trimmed[0] == '[' {
		if out, ok := fd.array(trimmed); ok {
			// The fast path takes no steps records: a record is a row.
			if len(out) > maxRows {
				return nil, &RowsError{Max: maxRows, Index: maxRows}
			}
			return out, nil
		}
		var raws []json.RawMessage
		if err := json.Unmarshal(NormalizeJSON(trimmed), &raws); err != nil {
			return nil, &RecordError{Index: 0, Msg: "malformed JSON array: " + jsonErrMsg(err)}
		}
		if len(raws) == 0 {
			return nil, ErrEmptyBatch
		}
		if len(raws) > MaxBatchRecords {
			return nil, &RecordError{Index: MaxBatchRecords, Msg: fmt.Sprintf("batch holds more than %d records", MaxBatchRecords)}
		}
		out := make([]Record, 0, len(raws))
		rows := 0
		for i, raw := range raws {
			rec, ok := fd.record(raw)
			if !ok {
				var err *RecordError
				if rec, err = decodeRecordWithin(raw, maxRows-rows); err != nil {
					return nil, err.at(i, 0, maxRows)
				}
			}
			if rows += rec.Rows(); rows > maxRows {
				return nil, &RowsError{Max: maxRows, Index: i}
			}
			out = append(out, rec)
		}
		return out, nil
	}
	out := make([]Record, 0, min(bytes.Count(body, []byte{'\n'})+1, MaxBatchRecords))
	rows := 0
	for line, l := range NDJSONLines(body) {
		if len(out) >= MaxBatchRecords {
			return nil, &RecordError{Index: len(out), Line: line, Msg: fmt.Sprintf("batch holds more than %d records", MaxBatchRecords)}
		}
		rec, ok := fd.record(l)
		if !ok {
			var err *RecordError
			rec, err = decodeRecordWithin(NormalizeJSON(l), maxRows-rows)
			if err != nil {
				return nil, err.at(len(out), line, maxRows)
			}
		}
		if rows += rec.Rows(); rows > maxRows {
			return nil, &RowsError{Max: maxRows, Index: len(out), Line: line}
		}
		out = append(out, rec)
	}
	if len(out) == 0 {
		return nil, ErrEmptyBatch
	}
	return out, nil
}

// DecodeRecord decodes and validates one record. Its input may already have
// been passed through [NormalizeJSON]; it is normalised again if not.
func DecodeRecord(raw []byte) (Record, *RecordError) {
	var fd fastDecoder
	if rec, ok := fd.record(raw); ok {
		return rec, nil
	}
	return decodeRecord(raw)
}

// decodeRecord is the general path of [DecodeRecord], through
// encoding/json; it decides every record the fast path gives up on and
// words every error.
func decodeRecord(raw []byte) (Record, *RecordError) {
	return decodeRecordWithin(raw, MaxBatchRecords)
}

// decodeRecordWithin is decodeRecord for a record that may expand to at
// most maxRows rows; a steps record with more steps is refused with the
// error's rows flag set, before its rows are built.
func decodeRecordWithin(raw []byte, maxRows int) (Record, *RecordError) {
	raw = NormalizeJSON(raw)
	var head struct {
		Kind json.RawMessage `json:"kind"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return Record{}, &RecordError{Msg: "malformed JSON: " + jsonErrMsg(err)}
	}
	if len(head.Kind) == 0 {
		return Record{}, &RecordError{Field: "kind", Msg: "missing"}
	}
	if k := DuplicateKey(raw); k != "" {
		return Record{}, &RecordError{Msg: fmt.Sprintf("key %q appears twice in one object; send each key once", truncate(k, 60))}
	}
	var kind string
	if err := json.Unmarshal(head.Kind, &kind); err != nil {
		return Record{}, &RecordError{Field: "kind", Msg: "want a string"}
	}
	if kind == KindSteps {
		return decodeSteps(raw, maxRows)
	}
	var rec Record
	var target any
	switch kind {
	case KindRun:
		rec.Run = &Run{}
		target = rec.Run
	case KindStep:
		rec.Step = &Step{}
		target = rec.Step
	case KindLayers:
		rec.Layers = &Layers{}
		target = rec.Layers
	case KindEval:
		rec.Eval = &Eval{}
		target = rec.Eval
	case KindGPU:
		rec.GPU = &GPU{}
		target = rec.GPU
	case KindHost:
		rec.Host = &Host{}
		target = rec.Host
	case KindMemory:
		rec.Memory = &Memory{}
		target = rec.Memory
	case KindEvent:
		rec.Event = &Event{}
		target = rec.Event
	case KindEnd:
		rec.End = &End{}
		target = rec.End
	case KindProcess:
		rec.Process = &Process{}
		target = rec.Process
	default:
		return Record{}, &RecordError{Field: "kind", Msg: fmt.Sprintf("unknown kind %q (want one of %s)", truncate(kind, 40), strings.Join(Kinds, ", "))}
	}
	if err := json.Unmarshal(raw, target); err != nil {
		re := &RecordError{Kind: kind, Msg: jsonErrMsg(err)}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			re.Field = te.Field
			re.Msg = fmt.Sprintf("want %s, got %s", te.Type.String(), te.Value)
		}
		var fe *fieldErr
		if errors.As(err, &fe) {
			re.Field = fe.field
			re.Msg = fe.msg
		}
		if re.Field == "" {
			re.Field = guessField(err)
		}
		if re.Field == "" {
			re.Field = locateField(raw, target)
		}
		return Record{}, re
	}
	if err := validate(rec); err != nil {
		err.Kind = kind
		return Record{}, err
	}
	return rec, nil
}

type fieldErr struct{ field, msg string }

func (e *fieldErr) Error() string { return e.field + ": " + e.msg }

// guessField pulls a field name out of errors from custom unmarshalers,
// which encoding/json reports without one.
func guessField(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "Go struct field "); i >= 0 {
		rest := msg[i+len("Go struct field "):]
		if j := strings.IndexByte(rest, ' '); j > 0 {
			rest = rest[:j]
		}
		if k := strings.IndexByte(rest, '.'); k >= 0 {
			rest = rest[k+1:]
		}
		return rest
	}
	return ""
}

func jsonErrMsg(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%s (at byte %d)", se.Error(), se.Offset)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

func validate(rec Record) *RecordError {
	v := &validator{}
	switch {
	case rec.Run != nil:
		r := rec.Run
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
	case rec.Step != nil:
		s := rec.Step
		v.id("run_id", s.RunID, true)
		v.rank("rank", s.Rank)
		v.step("step", s.Step, true)
		v.metrics("metrics", s.Metrics)
		v.stepFields(s)
	case rec.Layers != nil:
		l := rec.Layers
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
	case rec.Eval != nil:
		e := rec.Eval
		v.id("run_id", e.RunID, true)
		v.step("step", e.Step, true)
		v.id("split", e.Split, false)
		v.metrics("metrics", e.Metrics)
	case rec.GPU != nil:
		g := rec.GPU
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
	case rec.Host != nil:
		h := rec.Host
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
	case rec.Memory != nil:
		m := rec.Memory
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
	case rec.Event != nil:
		e := rec.Event
		v.id("run_id", e.RunID, true)
		v.id("type", e.Type, true)
		v.text("text", e.Text)
		v.step("step", e.Step, false)
		if e.Rank != nil {
			v.rank("rank", *e.Rank)
		}
	case rec.End != nil:
		e := rec.End
		v.id("run_id", e.RunID, true)
		switch e.Status {
		case StatusFinished, StatusFailed, StatusKilled:
		case "":
			v.fail("status", "missing (want finished, failed or killed)")
		default:
			v.fail("status", fmt.Sprintf("unknown status %q (want finished, failed or killed)", truncate(e.Status, 40)))
		}
		v.object("summary", e.Summary)
	case rec.Process != nil:
		p := rec.Process
		v.id("run_id", p.RunID, true)
		v.rank("rank", p.Rank)
		v.rank("local_rank", p.LocalRank)
		if p.PID <= 0 {
			v.fail("pid", "want a positive process id")
		}
	}
	return v.err
}

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

// RunMetaKnown lists the JSON keys of RunMeta's typed fields.
var runMetaKnown = map[string]bool{}

func init() {
	for _, k := range []string{"model", "params", "gpu", "gpu_memory_total_gb", "zero_stage", "precision", "world_size",
		"micro_batch", "grad_accum", "effective_batch", "pipeline_stages", "tensor_parallel", "offload_optimizer",
		"offload_params", "parallelism", "seq_len", "epochs", "total_steps", "framework", "command", "git_commit", "job_id", "host", "versions"} {
		runMetaKnown[k] = true
	}
}

type runMetaAlias RunMeta

// UnmarshalJSON keeps unknown keys in Extra.
func (m *RunMeta) UnmarshalJSON(b []byte) error {
	var a runMetaAlias
	if err := json.Unmarshal(b, &a); err != nil {
		return err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		return err
	}
	*m = RunMeta(a)
	for k, v := range all {
		if !runMetaKnown[k] {
			if m.Extra == nil {
				m.Extra = map[string]json.RawMessage{}
			}
			m.Extra[k] = v
		}
	}
	return nil
}

// MarshalJSON writes the typed fields and Extra side by side.
func (m RunMeta) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(runMetaAlias(m))
	if err != nil || len(m.Extra) == 0 {
		return b, err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		return nil, err
	}
	for k, v := range m.Extra {
		if !runMetaKnown[k] {
			all[k] = v
		}
	}
	return json.Marshal(all)
}
