package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// decodeBatchGeneral is DecodeBatch as it was before the fast path: every
// record through encoding/json. The fast path must not change a single
// accepted record or error.
func decodeBatchGeneral(body []byte) ([]Record, error) {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 {
		return nil, ErrEmptyBatch
	}
	if trimmed[0] == '[' {
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
		for i, raw := range raws {
			rec, err := decodeRecord(raw)
			if err != nil {
				err.Index = i
				return nil, err
			}
			out = append(out, rec)
		}
		return out, nil
	}
	var out []Record
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64*1024), len(body)+1)
	line := 0
	for sc.Scan() {
		line++
		l := bytes.TrimSpace(sc.Bytes())
		if len(l) == 0 {
			continue
		}
		if len(out) >= MaxBatchRecords {
			return nil, &RecordError{Index: len(out), Line: line, Msg: fmt.Sprintf("batch holds more than %d records", MaxBatchRecords)}
		}
		rec, err := decodeRecord(NormalizeJSON(l))
		if err != nil {
			err.Index = len(out)
			err.Line = line
			return nil, err
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, &RecordError{Index: len(out), Line: line + 1, Msg: "reading body: " + err.Error()}
	}
	if len(out) == 0 {
		return nil, ErrEmptyBatch
	}
	return out, nil
}

// same compares decoded values exactly: NaN equals NaN with the same bits,
// nil differs from empty, times compare with ==.
func same(a, b reflect.Value) bool {
	if a.Kind() != b.Kind() || a.Type() != b.Type() {
		return false
	}
	switch a.Kind() {
	case reflect.Pointer:
		if a.IsNil() || b.IsNil() {
			return a.IsNil() == b.IsNil()
		}
		return same(a.Elem(), b.Elem())
	case reflect.Slice:
		if a.IsNil() != b.IsNil() || a.Len() != b.Len() {
			return false
		}
		for i := 0; i < a.Len(); i++ {
			if !same(a.Index(i), b.Index(i)) {
				return false
			}
		}
		return true
	case reflect.Map:
		if a.IsNil() != b.IsNil() || a.Len() != b.Len() {
			return false
		}
		for _, k := range a.MapKeys() {
			bv := b.MapIndex(k)
			if !bv.IsValid() || !same(a.MapIndex(k), bv) {
				return false
			}
		}
		return true
	case reflect.Struct:
		if a.Type() == reflect.TypeFor[time.Time]() {
			return a.Interface().(time.Time) == b.Interface().(time.Time)
		}
		for i := 0; i < a.NumField(); i++ {
			if !same(a.Field(i), b.Field(i)) {
				return false
			}
		}
		return true
	case reflect.Float32, reflect.Float64:
		return math.Float64bits(a.Float()) == math.Float64bits(b.Float())
	case reflect.String:
		return a.String() == b.String()
	case reflect.Int, reflect.Int64, reflect.Int32:
		return a.Int() == b.Int()
	case reflect.Bool:
		return a.Bool() == b.Bool()
	case reflect.Uint8:
		return a.Uint() == b.Uint()
	}
	panic("same: unhandled kind " + a.Kind().String())
}

func checkSameAsGeneral(t *testing.T, body []byte) {
	t.Helper()
	got, gotErr := DecodeBatch(body)
	want, wantErr := decodeBatchGeneral(body)
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Fatalf("error %v, general path %v\nbody %q", gotErr, wantErr, body)
	}
	if gotErr != nil {
		gre, ok1 := gotErr.(*RecordError)
		wre, ok2 := wantErr.(*RecordError)
		if ok1 != ok2 || (ok1 && *gre != *wre) {
			t.Fatalf("error %#v, general path %#v", gotErr, wantErr)
		}
	}
	if !same(reflect.ValueOf(got), reflect.ValueOf(want)) {
		t.Fatalf("records differ from the general path's\nbody %q\ngot  %s\nwant %s", body, dump(got), dump(want))
	}
}

func dump(recs []Record) string {
	var b strings.Builder
	for _, r := range recs {
		for _, v := range []any{r.Step, r.Layers, r.Eval, r.Run, r.GPU, r.Host, r.Memory, r.Event, r.End, r.Process} {
			if !reflect.ValueOf(v).IsNil() {
				fmt.Fprintf(&b, "%+v\n", reflect.ValueOf(v).Elem().Interface())
			}
		}
	}
	return b.String()
}

var fastSeeds = []string{
	`{"kind":"step","run_id":"r","rank":3,"step":7,"time":"2025-01-01T00:00:00.5Z","loss":0.25,"lr":2e-05,"skipped":false,"samples":12,"tokens":-1,"metrics":{"a":1,"b":NaN,"a":2}}`,
	`{"kind": "step", "run_id": "r", "rank": 0, "step": 1, "time": 1735689600.25, "loss": NaN, "grad_norm": Infinity, "lr": -Infinity}`,
	`{"kind":"step","run_id":"r","step":1,"loss":"NaN","epoch":"-inf","comm_ms":"+Infinity","data_ms":1e999,"cpu_util_pct":-0.0}`,
	`{"kind":"step","run_id":"r","step":1,"tokens":4096,"step_ms":80,"tflops":123.456,"mfu":0.4125}`,
	`{"kind":"step","run_id":"r","step":1,"tflops":NaN,"mfu":"x"}`,
	`{"kind":"step","run_id":"r","rank":3,"step":1,"sync_ns":1735689601123456789,"sync_wait_ms":12.5,"input_wait_ms":0}`,
	`{"kind":"step","run_id":"r","step":1,"sync_ns":-1,"sync_wait_ms":-2}`,
	`{"kind":"step","run_id":"r","step":1,"sync_ns":1.5}`,
	`{"kind":"step","run_id":"r","step":1,"loss":NaNx}`,
	`{"kind":"step","run_id":"r","step":1,"loss":-NaN}`,
	`{"kind":"step","run_id":"r","step":1,"loss":null}`,
	`{"kind":"step","run_id":"r","step":1,"Loss":1}`,
	`{"kind":"step","run_id":"r","step":1,"step":2}`,
	`{"kind":"step","run_id":"r","step":01}`,
	`{"kind":"step","run_id":"r","step":1.0}`,
	`{"kind":"step","run_id":"r","step":9007199254740993}`,
	`{"kind":"step","run_id":"r","step":99999999999999999999}`,
	`{"kind":"step","run_id":"r","rank":-1,"step":1}`,
	`{"kind":"step","run_id":"r\u0041","step":1}`,
	`{"kind":"step","run_id":"rü","step":1}`,
	"{\"kind\":\"step\",\"run_id\":\"r\xff\",\"step\":1}",
	`{"kind":"step","run_id":"r","step":1,"metrics":{}}`,
	`{"kind":"step","run_id":"r","step":1,"metrics":{"":1}}`,
	`{"kind":"step","run_id":"r","step":1,"time":"yesterday"}`,
	`{"kind":"step","run_id":"r","step":1,"time":-5}`,
	`{"kind":"step","run_id":"r","step":1,"time":"1735689600"}`,
	`{"kind":"step","run_id":"r","step":1,"time":1e999}`,
	`{"kind":"step","run_id":"r","step":1,"skipped":true,}`,
	`{"kind":"step","run_id":"r","step":1} x`,
	`{"kind":"step","run_id":"r","step":1,"kind":"eval"}`,
	`{"run_id":"r","kind":"step","step":1}`,
	`{"kind":"layers","run_id":"r","rank":1,"step":2,"names":["a","b","a"],"forward_ms":[1,NaN,3],"backward_ms":[]}`,
	`{"kind":"layers","run_id":"r","step":2,"names":[],"forward_ms":[]}`,
	`{"kind":"layers","run_id":"r","step":2,"names":["a"],"forward_ms":[1],"backward_ms":[1,2]}`,
	`{"kind":"layers","run_id":"r","step":2,"names":["a"],"forward_ms":[1 , 2 ]}`,
	`{"kind":"eval","run_id":"r","step":5,"split":"test","loss":1,"accuracy":0.5,"f1":"NaN","metrics":{"bleu":30}}`,
	`{"kind":"eval","run_id":"r","step":5,"split":""}`,
	`{"kind":"event","run_id":"r","type":"note"}`,
	"[" + `{"kind":"step","run_id":"r","step":1}` + " , " + `{"kind":"eval","run_id":"r","step":1,"loss":NaN}` + "]\n",
	"[" + `{"kind":"step","run_id":"r","step":1}` + "," + `{"kind":"eval","run_id":"r","step":-1}` + "]",
	"[" + `{"kind":"step","run_id":"r","step":1}` + "," + `{"kind":"eval","run_id":"r","step":1}` + "] x",
	"[]",
	"\n\n" + `{"kind":"step","run_id":"r","step":1}` + "\r\n\n" + `{"kind":"step","run_id":"r","step":1,"loss":true}` + "\n",
}

func TestFastDecoderMatchesGeneralPath(t *testing.T) {
	for _, s := range fastSeeds {
		checkSameAsGeneral(t, []byte(s))
	}
	for _, python := range []bool{false, true} {
		body := benchBatchBody(python)
		checkSameAsGeneral(t, body)
		// The records senders write must take the fast path.
		var fd fastDecoder
		for _, l := range bytes.Split(bytes.TrimSpace(body), []byte("\n")) {
			if _, ok := fd.record(l); !ok {
				t.Errorf("fast path gave up on %s", l)
			}
		}
	}
}

// FuzzFastDecoder: DecodeBatch answers exactly what the general path does,
// records and errors alike.
func FuzzFastDecoder(f *testing.F) {
	for _, s := range fastSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(everyStepFieldLine()))
	body := benchBatchBody(true)
	for _, l := range bytes.SplitN(body, []byte("\n"), 4)[:3] {
		f.Add(l)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkSameAsGeneral(t, body)
	})
}

// benchBatchBody is a few records shaped like the benchmark's.
func benchBatchBody(python bool) []byte {
	sep, col := ",", ":"
	ts := `"2025-01-01T00:00:00.55Z"`
	if python {
		sep, col, ts = ", ", ": ", "1735689600.55"
	}
	var b bytes.Buffer
	for r := 0; r < 3; r++ {
		fmt.Fprintf(&b, `{"kind"%[2]s"step"%[1]s"run_id"%[2]s"run"%[1]s"rank"%[2]s%[3]d%[1]s"step"%[2]s10%[1]s"time"%[2]s%[4]s%[1]s"loss"%[2]s0.731%[1]s"lr"%[2]s2e-05%[1]s"samples"%[2]s160%[1]s"gpu_util_pct"%[2]s96}`+"\n", sep, col, r, ts)
		fmt.Fprintf(&b, `{"kind"%[2]s"layers"%[1]s"run_id"%[2]s"run"%[1]s"rank"%[2]s%[3]d%[1]s"step"%[2]s10%[1]s"time"%[2]s%[4]s%[1]s"names"%[2]s["embeddings"%[1]s"encoder.0"]%[1]s"forward_ms"%[2]s[1.8%[1]s2.1]%[1]s"backward_ms"%[2]s[3.42%[1]sNaN]}`+"\n", sep, col, r, ts)
	}
	fmt.Fprintf(&b, `{"kind"%[2]s"eval"%[1]s"run_id"%[2]s"run"%[1]s"step"%[2]s10%[1]s"time"%[2]s%[3]s%[1]s"split"%[2]s"val"%[1]s"loss"%[2]s0.5}`+"\n", sep, col, ts)
	return b.Bytes()
}

// exactFloat converts a whole literal on exactFloatPrefix's exact path;
// ok is false for anything that path leaves to strconv.
func exactFloat(lit []byte) (float64, bool) {
	v, n, ok := exactFloatPrefix(lit)
	return v, ok && n == len(lit)
}

func TestExactFloatMatchesParseFloat(t *testing.T) {
	lits := []string{"0", "-0", "0.0", "-0.0", "1", "-1", "2e-05", "65536", "0.731", "172.023", "1e22", "1e23", "1e-22",
		"123456789012345", "1234567890123456", "0.000000000000000000000001", "9007199254740993", "1.5E+3", "0e999", "-0e-999",
		"3.141592653589793", "0.1", "0.30000000000000004", "1e308", "4.9e-324", "100000000000000000000000"}
	r := uint64(1)
	for i := 0; i < 200000; i++ {
		r ^= r << 13
		r ^= r >> 7
		r ^= r << 17
		digits := strconvFormat(r)
		lits = append(lits, digits)
	}
	for _, lit := range lits {
		want, err := strconv.ParseFloat(lit, 64)
		got, ok := exactFloat([]byte(lit))
		if ok && (err != nil || math.Float64bits(got) != math.Float64bits(want)) {
			t.Fatalf("exactFloat(%s) = %v, ParseFloat %v (%v)", lit, got, want, err)
		}
	}
}

// strconvFormat turns random bits into a number literal of a few shapes.
func strconvFormat(r uint64) string {
	m := r % 1_000_000_000_000_000
	frac := int(r>>50) % 20
	s := strconv.FormatUint(m, 10)
	if frac > 0 && frac < len(s) {
		s = s[:len(s)-frac] + "." + s[len(s)-frac:]
	}
	switch (r >> 58) % 4 {
	case 1:
		s += "e" + strconv.Itoa(int(r>>40)%30)
	case 2:
		s += "e-" + strconv.Itoa(int(r>>40)%30)
	case 3:
		s = "-" + s
	}
	return s
}

// TFLOP/s and MFU take the fast path and land in their fields.
func TestFastDecoderReadsTFLOPSAndMFU(t *testing.T) {
	var fd fastDecoder
	rec, ok := fd.record([]byte(`{"kind":"step","run_id":"r","rank":1,"step":9,"tokens":4096,"step_ms":80,"tflops":123.456,"mfu":0.4125}`))
	if !ok || rec.Step == nil {
		t.Fatalf("fast path gave up: %+v", rec)
	}
	if rec.Step.TFLOPS == nil || *rec.Step.TFLOPS != 123.456 || rec.Step.MFU == nil || *rec.Step.MFU != 0.4125 {
		t.Fatalf("tflops %v mfu %v", rec.Step.TFLOPS, rec.Step.MFU)
	}
}
