package api_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

func TestDecodeBatchForms(t *testing.T) {
	ndjson := "\r\n" + `{"kind":"step","run_id":"r","rank":0,"step":1,"time":1735689600.25,"loss":NaN}` + "\r\n\n" +
		`{"kind":"eval","run_id":"r","step":1,"time":"2025-01-01T00:00:01Z","accuracy":-Infinity}` + "\n"
	array := `[ {"kind":"step","run_id":"r","rank":0,"step":1,"time":1735689600.25,"loss":NaN},
		{"kind":"eval","run_id":"r","step":1,"time":"2025-01-01T00:00:01Z","accuracy":-Infinity} ]`
	for name, body := range map[string]string{"ndjson": ndjson, "array": array} {
		t.Run(name, func(t *testing.T) {
			recs, err := api.DecodeBatch([]byte(body))
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != 2 || recs[0].Kind() != api.KindStep || recs[1].Kind() != api.KindEval {
				t.Fatalf("decoded %d records: %+v", len(recs), recs)
			}
			s := recs[0].Step
			if !math.IsNaN(float64(*s.Loss)) || !s.Time.Equal(time.Unix(1735689600, 250_000_000)) {
				t.Fatalf("step loss %v time %v", *s.Loss, s.Time)
			}
			if !math.IsInf(float64(*recs[1].Eval.Accuracy), -1) || recs[1].RunID() != "r" {
				t.Fatalf("eval %+v", recs[1].Eval)
			}
		})
	}
}

// Bare tokens become numbers; the same letters inside strings stay text.
func TestDecodeNonFiniteOnlyOutsideStrings(t *testing.T) {
	recs, err := api.DecodeBatch([]byte(`{"kind":"event","run_id":"NaN","type":"Infinity","text":"x \"NaN\" -Infinity \\"}`))
	if err != nil {
		t.Fatal(err)
	}
	e := recs[0].Event
	if e.RunID != "NaN" || e.Type != "Infinity" || e.Text != `x "NaN" -Infinity \` {
		t.Fatalf("event = %+v", e)
	}
}

func TestDecodeBatchErrors(t *testing.T) {
	cases := []struct {
		name, body  string
		line, index int
		field, msg  string
	}{
		{"unknown kind", "{\"kind\":\"step\",\"run_id\":\"r\",\"step\":1}\n{\"kind\":\"gpux\"}", 2, 1, "kind", "unknown kind"},
		{"missing step", `{"kind":"step","run_id":"r"}`, 1, 0, "step", "missing"},
		{"missing run_id", `{"kind":"layers","step":1,"names":["a"],"forward_ms":[1]}`, 1, 0, "run_id", "missing"},
		{"float for string", `{"kind":"step","run_id":5,"step":1}`, 1, 0, "run_id", "want string"},
		{"string for float", `{"kind":"step","run_id":"r","step":1,"grad_norm":"big"}`, 1, 0, "grad_norm", "want a number"},
		{"nested meta", `{"kind":"run","run_id":"r","meta":{"zero_stage":"two"}}`, 1, 0, "meta.zero_stage", ""},
		{"negative total steps", `{"kind":"run","run_id":"r","meta":{"total_steps":-1}}`, 1, 0, "meta.total_steps", "want 0"},
		{"bad time", `{"kind":"step","run_id":"r","step":1,"time":"yesterday"}`, 1, 0, "time", "RFC 3339"},
		{"negative rank", `{"kind":"step","run_id":"r","rank":-3,"step":1}`, 1, 0, "rank", "got -3"},
		{"step too large", `{"kind":"step","run_id":"r","step":9007199254740993}`, 1, 0, "step", "want 0"},
		{"long id", `{"kind":"eval","run_id":"` + strings.Repeat("r", 257) + `","step":1}`, 1, 0, "run_id", "longer than 256"},
		{"tags", `{"kind":"run","run_id":"r","tags":[""]}`, 1, 0, "tags[0]", "missing"},
		{"arrays differ", `{"kind":"layers","run_id":"r","step":1,"names":["a"],"forward_ms":[1],"backward_ms":[1,2]}`, 1, 0, "backward_ms", "entries"},
		{"config not object", `{"kind":"run","run_id":"r","config":[1]}`, 1, 0, "config", "object"},
		{"end status", `{"kind":"end","run_id":"r"}`, 1, 0, "status", "missing"},
		{"gpu no time", `{"kind":"gpu","host":"h","gpu":0}`, 1, 0, "time", "missing"},
		{"nul in text", `{"kind":"event","run_id":"r","type":"t","text":"a\u0000b"}`, 1, 0, "text", "UTF-8"},
		{"malformed", "{\"kind\":\"step\"\n", 1, 0, "", "malformed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := api.DecodeBatch([]byte(c.body))
			var re *api.RecordError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want a *RecordError", err)
			}
			if re.Line != c.line || re.Index != c.index || re.Field != c.field || !strings.Contains(re.Error(), c.msg) {
				t.Fatalf("error %q = line %d index %d field %q; want line %d index %d field %q containing %q",
					re.Error(), re.Line, re.Index, re.Field, c.line, c.index, c.field, c.msg)
			}
		})
	}
	if _, err := api.DecodeBatch([]byte(" \n\t")); !errors.Is(err, api.ErrEmptyBatch) {
		t.Fatalf("empty body: %v", err)
	}
	if _, err := api.DecodeBatch([]byte("[]")); !errors.Is(err, api.ErrEmptyBatch) {
		t.Fatalf("empty array: %v", err)
	}
}

func TestDecodeBatchTooManyRecords(t *testing.T) {
	line := []byte(`{"kind":"process","run_id":"r","rank":0,"local_rank":0,"pid":1}` + "\n")
	body := bytes.Repeat(line, api.MaxBatchRecords+1)
	_, err := api.DecodeBatch(body)
	var re *api.RecordError
	if !errors.As(err, &re) || !strings.Contains(re.Msg, "more than") {
		t.Fatalf("err = %v", err)
	}
}

func TestRunMetaKeepsUnknownKeys(t *testing.T) {
	recs, err := api.DecodeBatch([]byte(`{"kind":"run","run_id":"r","meta":{"model":"m","zero_stage":3,"moe_experts":8,"notes":{"a":1}}}`))
	if err != nil {
		t.Fatal(err)
	}
	m := recs[0].Run.Meta
	if m.Model != "m" || *m.ZeroStage != 3 || string(m.Extra["moe_experts"]) != "8" {
		t.Fatalf("meta = %+v", m)
	}
	b, _ := json.Marshal(m)
	var back map[string]any
	_ = json.Unmarshal(b, &back)
	if back["moe_experts"] != 8.0 || back["zero_stage"] != 3.0 || back["notes"] == nil {
		t.Fatalf("re-encoded meta = %s", b)
	}
}

func recordValue(r api.Record) any {
	for _, v := range []any{r.Run, r.Step, r.Layers, r.Eval, r.GPU, r.Host, r.Memory, r.Event, r.End, r.Process} {
		switch p := v.(type) {
		case *api.Run:
			if p != nil {
				return p
			}
		case *api.Step:
			if p != nil {
				return p
			}
		case *api.Layers:
			if p != nil {
				return p
			}
		case *api.Eval:
			if p != nil {
				return p
			}
		case *api.GPU:
			if p != nil {
				return p
			}
		case *api.Host:
			if p != nil {
				return p
			}
		case *api.Memory:
			if p != nil {
				return p
			}
		case *api.Event:
			if p != nil {
				return p
			}
		case *api.End:
			if p != nil {
				return p
			}
		case *api.Process:
			if p != nil {
				return p
			}
		}
	}
	return nil
}

// FuzzDecodeBatch: no input makes the decoder panic, and an accepted batch
// re-encodes (non-finite numbers as strings) to one that decodes to the
// same records.
func FuzzDecodeBatch(f *testing.F) {
	// The records that once reached the database with values it refused.
	for _, p := range poisonObjects {
		f.Add([]byte(`{"kind":"run","run_id":"p","config":` + p + `}`))
		f.Add([]byte(`{"kind":"end","run_id":"p","status":"finished","summary":` + p + `}`))
		f.Add([]byte(`{"kind":"run","run_id":"p","meta":` + p + `}`))
	}
	f.Add([]byte(`{"kind":"host","host":"n1","time":1000,"processes":[{"pid":1,"run_id":"r\u0000"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		recs, err := api.DecodeBatch(body)
		if err != nil {
			if len(recs) != 0 {
				t.Fatalf("error %v with %d records", err, len(recs))
			}
			return
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		for _, r := range recs {
			if err := enc.Encode(recordValue(r)); err != nil {
				t.Fatalf("re-encode %s: %v", r.Kind(), err)
			}
		}
		again, err := api.DecodeBatch(buf.Bytes())
		if err != nil {
			t.Fatalf("re-encoded batch rejected: %v\n%s", err, buf.Bytes())
		}
		if len(again) != len(recs) {
			t.Fatalf("re-encoded batch has %d records, want %d", len(again), len(recs))
		}
		for i := range recs {
			if recs[i].Kind() != again[i].Kind() || recs[i].RunID() != again[i].RunID() {
				t.Fatalf("record %d: %s/%q became %s/%q", i, recs[i].Kind(), recs[i].RunID(), again[i].Kind(), again[i].RunID())
			}
		}
	})
}

// Code longer than the cap, or holding NUL, is refused with the field
// named; code at the cap is accepted.
func TestRunCodeLimits(t *testing.T) {
	rec := func(code map[string]any) []byte {
		b, _ := json.Marshal(map[string]any{"kind": "run", "run_id": "r", "code": code})
		return b
	}
	atCap := strings.Repeat("x", api.MaxCodeText)
	if _, err := api.DecodeBatch(rec(map[string]any{"source": atCap, "git_diff": atCap})); err != nil {
		t.Fatalf("code at the cap: %v", err)
	}
	for field, code := range map[string]map[string]any{
		"code.source":     {"source": atCap + "y"},
		"code.git_diff":   {"git_diff": atCap + "y"},
		"code":            {"source": "a\u0000b"},
		"code.entry_path": {"entry_path": strings.Repeat("p", api.MaxTextLen+1)},
	} {
		_, err := api.DecodeBatch(rec(code))
		var re *api.RecordError
		if !errors.As(err, &re) || re.Field != field {
			t.Errorf("%s: err = %v, want a record error on %s", field, err, field)
		}
	}
}
