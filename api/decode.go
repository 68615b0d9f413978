package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
		// Counted before anything is decoded: an array of millions of
		// tiny entries takes many times its bytes as records.
		if arrayPast(trimmed, maxRows) {
			return nil, &RowsError{Max: maxRows, Index: maxRows}
		}
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
	if _, _, err := EachNDJSON(body, maxRows, func(_ int, _ []byte, rec Record) error {
		out = append(out, rec)
		return nil
	}); err != nil {
		return nil, err
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
	var kind string
	kindErr := json.Unmarshal(head.Kind, &kind)
	if re := tooWide(raw, kind, maxRows); re != nil {
		return Record{}, re
	}
	if k := DuplicateKey(raw); k != "" {
		return Record{}, &RecordError{Msg: fmt.Sprintf("key %q appears twice in one object; send each key once", truncate(k, 60))}
	}
	if kindErr != nil {
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
