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
	scalar json.RawMessage   // one value for every step, or nil
	vals   []json.RawMessage // one per step, when an array
}

func (c *stepsColumn) at(i int) json.RawMessage {
	if c.vals != nil {
		return c.vals[i]
	}
	return c.scalar
}

// decodeSteps decodes a steps record into its step records.
func decodeSteps(raw []byte) (Record, *RecordError) {
	raw = NormalizeJSON(raw)
	fail := func(field, msg string) (Record, *RecordError) {
		return Record{}, &RecordError{Kind: KindSteps, Field: field, Msg: msg}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return fail("", "malformed JSON: "+jsonErrMsg(err))
	}
	stepsRaw, ok := fields["step"]
	if !ok {
		return fail("step", "missing")
	}
	var steps []json.RawMessage
	if err := json.Unmarshal(stepsRaw, &steps); err != nil {
		return fail("step", "want an array of step numbers")
	}
	n := len(steps)
	switch {
	case n == 0:
		return fail("step", "empty")
	case n > MaxBatchRecords:
		return fail("step", fmt.Sprintf("more than %d steps", MaxBatchRecords))
	}
	column := func(key string, v json.RawMessage) (stepsColumn, *RecordError) {
		c := stepsColumn{key: key}
		if t := bytes.TrimSpace(v); len(t) > 0 && t[0] == '[' {
			if err := json.Unmarshal(t, &c.vals); err != nil {
				_, re := fail(key, "malformed array: "+jsonErrMsg(err))
				return c, re
			}
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
			var m map[string]json.RawMessage
			if err := json.Unmarshal(v, &m); err != nil {
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

	out := make([]*Step, n)
	for i := range steps {
		row := make([]byte, 0, 256)
		row = append(row, `{"kind":"step"`...)
		row = append(row, head...)
		row = appendKey(row, "step")
		row = append(row, steps[i]...)
		for c := range cols {
			if v := cols[c].at(i); !isNull(v) {
				row = appendKey(row, cols[c].key)
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
					row = appendJSONString(row, metrics[c].key)
					row = append(row, ':')
					row = append(row, v...)
				}
			}
			row = append(row, '}')
		}
		row = append(row, '}')
		rec, err := DecodeRecord(row)
		if err != nil {
			err.Kind = KindSteps
			err.Msg = fmt.Sprintf("step %s (entry %d): %s", stepLabel(steps[i]), i, err.Msg)
			return Record{}, err
		}
		out[i] = rec.Step
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
