package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
)

// A steps record carries many steps of one rank as columns, so that a
// sender measuring every step writes one JSON object per batch of steps
// instead of one per step:
//
//	{"kind":"steps","run_id":"r1","rank":0,"step":[7,8,9],"time":[…],
//	 "step_ms":[1.9,2.0,1.9],"lr":0.001,"forward_ms":[null,0.4,null],
//	 "metrics":{"acc":[0.5,0.6,0.7]}}
//
// "step" is an array of step numbers; every other field of a step record
// is either an array with one entry per step (null where that step has no
// value) or one value for every step. "run_id" and "rank" are one value.
// Each step is decoded and validated exactly as a step record with those
// fields would be; the first bad one refuses the record, naming the step.

type stepsColumn struct {
	key    string
	prefix []byte            // the member's key as the row writes it: ,"key":
	scalar json.RawMessage   // one value for every step, or nil
	vals   []json.RawMessage // one per step, when an array
}

func (c *stepsColumn) at(i int) json.RawMessage {
	if c.vals != nil {
		return c.vals[i]
	}
	return c.scalar
}

// decodeSteps decodes a steps record into its step records; raw is
// normalised already (decodeRecord, its caller, did that).
func decodeSteps(raw []byte, maxRows int) (Record, *RecordError) {
	fail := func(field, msg string) (Record, *RecordError) {
		return Record{}, &RecordError{Kind: KindSteps, Field: field, Msg: msg}
	}
	fields, err := jsonMembers(raw)
	if err != nil {
		return fail("", "malformed JSON: "+jsonErrMsg(err))
	}
	stepsRaw, ok := fields["step"]
	if !ok {
		return fail("step", "missing")
	}
	steps, err := jsonElems(stepsRaw)
	if err != nil {
		return fail("step", "want an array of step numbers")
	}
	n := len(steps)
	switch {
	case n == 0:
		return fail("step", "empty")
	case n > MaxBatchRecords:
		return fail("step", fmt.Sprintf("more than %d steps", MaxBatchRecords))
	case n > maxRows:
		// More rows than the batch has left: refused before a row is built.
		return Record{}, &RecordError{Kind: KindSteps, Field: "step", rows: true,
			Msg: fmt.Sprintf("%d steps, more than the batch's rows allow", n)}
	}
	column := func(key string, v json.RawMessage) (stepsColumn, *RecordError) {
		c := stepsColumn{key: key}
		if t := bytes.TrimSpace(v); len(t) > 0 && t[0] == '[' {
			vals, err := jsonElems(t)
			if err != nil {
				_, re := fail(key, "malformed array: "+jsonErrMsg(err))
				return c, re
			}
			c.vals = vals
			if len(c.vals) != n {
				_, re := fail(key, fmt.Sprintf("has %d entries, step has %d", len(c.vals), n))
				return c, re
			}
			return c, nil
		}
		c.scalar = v
		return c, nil
	}
	var head []byte // "run_id" and "rank", the same for every step
	var cols, metrics []stepsColumn
	for k, v := range fields {
		switch k {
		case "kind", "step":
		case "run_id", "rank":
			if t := bytes.TrimSpace(v); len(t) > 0 && t[0] == '[' {
				return fail(k, "want one value for every step, not an array")
			}
			head = appendKey(head, k)
			head = append(head, v...)
		case "metrics":
			m, err := jsonMembers(v)
			if err != nil {
				return fail("metrics", "want an object of name: values")
			}
			if len(m) > MaxMetrics {
				return fail("metrics", fmt.Sprintf("more than %d entries", MaxMetrics))
			}
			for mk, mv := range m {
				c, err := column("metrics."+mk, mv)
				if err != nil {
					return Record{}, err
				}
				c.key = mk
				metrics = append(metrics, c)
			}
		default:
			c, err := column(k, v)
			if err != nil {
				return Record{}, err
			}
			cols = append(cols, c)
		}
	}
	// A stable order, so that a record decodes the same way every time.
	sort.Slice(cols, func(i, j int) bool { return cols[i].key < cols[j].key })
	sort.Slice(metrics, func(i, j int) bool { return metrics[i].key < metrics[j].key })
	for c := range cols {
		cols[c].prefix = appendKey(nil, cols[c].key)
	}
	for c := range metrics {
		metrics[c].prefix = append(appendJSONString(nil, metrics[c].key), ':')
	}
	stepKey := appendKey(head, "step")

	repeat := stepRepeats(steps)
	out := make([]*Step, 0, n)
	var fd fastDecoder // one for every step: the strings they share are read once
	rowCap := 64
	for i := range steps {
		if repeat != nil && repeat(i) {
			continue
		}
		// A buffer of its own for each step: the decoder keeps the last
		// time's bytes to compare the next one with.
		row := make([]byte, 0, rowCap)
		row = append(row, `{"kind":"step"`...)
		row = append(row, stepKey...)
		row = append(row, steps[i]...)
		for c := range cols {
			if v := cols[c].at(i); !isNull(v) {
				row = append(row, cols[c].prefix...)
				row = append(row, v...)
			}
		}
		if len(metrics) > 0 {
			row = append(row, `,"metrics":{`...)
			first := true
			for c := range metrics {
				if v := metrics[c].at(i); !isNull(v) {
					if !first {
						row = append(row, ',')
					}
					first = false
					row = append(row, metrics[c].prefix...)
					row = append(row, v...)
				}
			}
			row = append(row, '}')
		}
		row = append(row, '}')
		rowCap = max(rowCap, len(row))
		rec, ok := fd.record(row)
		var err *RecordError
		if !ok {
			rec, err = decodeRecord(row)
		}
		if err != nil {
			err.Kind = KindSteps
			err.Msg = fmt.Sprintf("step %s (entry %d): %s", stepLabel(steps[i]), i, err.Msg)
			return Record{}, err
		}
		out = append(out, rec.Step)
	}
	return Record{Steps: out}, nil
}

func appendKey(b []byte, key string) []byte {
	b = append(b, ',')
	b = appendJSONString(b, key)
	return append(b, ':')
}

// appendJSONString appends s as a JSON string (the key as it was sent,
// its escapes decoded, so it is encoded again).
func appendJSONString(b []byte, s string) []byte {
	js, _ := json.Marshal(s) // a string always encodes
	return append(b, js...)
}

func isNull(v json.RawMessage) bool {
	t := bytes.TrimSpace(v)
	return len(t) == 0 || string(t) == "null"
}

// stepLabel is a step number as sent, for an error message.
func stepLabel(raw json.RawMessage) string {
	return truncate(string(bytes.TrimSpace(raw)), 24)
}

// ExpandSteps returns recs with each steps record replaced by its step
// records, in place: what the store writes. recs itself is returned when
// it holds no steps record.
func ExpandSteps(recs []Record) []Record {
	batches, steps := 0, 0
	for _, r := range recs {
		if r.Steps != nil {
			batches++
			steps += len(r.Steps)
		}
	}
	if batches == 0 {
		return recs
	}
	out := make([]Record, 0, len(recs)-batches+steps)
	for _, r := range recs {
		if r.Steps == nil {
			out = append(out, r)
			continue
		}
		for _, s := range r.Steps {
			out = append(out, Record{Step: s})
		}
	}
	return out
}

// jsonMembers splits a JSON object into its members: a scan of the bytes
// where keys have no escapes, else encoding/json (which also words the
// error of malformed input). Values are checked where they are decoded.
func jsonMembers(b []byte) (map[string]json.RawMessage, error) {
	if m, ok := scanObject(b); ok {
		return m, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("want an object, got null")
	}
	return m, nil
}

// jsonElems splits a JSON array into its elements, as jsonMembers does.
func jsonElems(b []byte) ([]json.RawMessage, error) {
	if v, ok := scanArray(b); ok {
		return v, nil
	}
	var v []json.RawMessage
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	if v == nil {
		return nil, fmt.Errorf("want an array, got null")
	}
	return v, nil
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the end of the JSON value starting at b[i], checking
// its strings and brackets only (its contents are decoded later), or
// false.
func skipValue(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				end, ok := skipString(b, i)
				if !ok {
					return 0, false
				}
				i = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, true
				}
			}
			i++
		}
		return 0, false
	}
	start := i
	for i < len(b) {
		switch b[i] {
		case ',', ']', '}', ' ', '\t', '\n', '\r', '"', '{', '[', ':':
			return i, i > start
		}
		i++
	}
	return i, i > start
}

// skipString returns the index just past the string whose opening quote
// is at i, and false when it is not closed.
func skipString(b []byte, i int) (int, bool) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, true
		}
	}
	return 0, false
}

// scanObject splits an object whose keys have no escapes; false for
// anything else.
func scanObject(b []byte) (map[string]json.RawMessage, bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	m := map[string]json.RawMessage{}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return m, skipWS(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, false
		}
		end, ok := skipString(b, i)
		if !ok || bytes.IndexByte(b[i+1:end-1], '\\') >= 0 {
			return nil, false
		}
		key := string(b[i+1 : end-1])
		i = skipWS(b, end)
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		i = skipWS(b, i+1)
		vend, ok := skipValue(b, i)
		if !ok {
			return nil, false
		}
		m[key] = b[i:vend]
		i = skipWS(b, vend)
		if i >= len(b) {
			return nil, false
		}
		if b[i] == '}' {
			return m, skipWS(b, i+1) == len(b)
		}
		if b[i] != ',' {
			return nil, false
		}
		i = skipWS(b, i+1)
	}
}

// scanArray splits an array; false where the scan cannot.
func scanArray(b []byte) ([]json.RawMessage, bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, false
	}
	out := []json.RawMessage{}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return out, skipWS(b, i+1) == len(b)
	}
	for {
		end, ok := skipValue(b, i)
		if !ok {
			return nil, false
		}
		out = append(out, b[i:end])
		i = skipWS(b, end)
		if i >= len(b) {
			return nil, false
		}
		if b[i] == ']' {
			return out, skipWS(b, i+1) == len(b)
		}
		if b[i] != ',' {
			return nil, false
		}
		i = skipWS(b, i+1)
	}
}
