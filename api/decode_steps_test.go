package api_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// A steps record decodes to the step records its columns describe: arrays
// give each step its entry (null: none), a single value goes to every step.
func TestDecodeSteps(t *testing.T) {
	body := `{"kind":"run","run_id":"r","project":"p"}` + "\n" +
		`{"kind":"steps","run_id":"r","rank":3,"step":[7,8,9],"time":[1735689600.5,1735689601,1735689601.5],` +
		`"step_ms":[1.5,2,2.5],"lr":0.001,"forward_ms":[null,0.4,null],"loss":[NaN,1.25,Infinity],` +
		`"samples":32,"sync_ns":[null,null,1735689601000000001],"skipped":[false,true,false],` +
		`"metrics":{"acc":[0.5,null,0.75],"lr_scale":2}}` + "\n"
	recs, err := api.DecodeBatch([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[1].Kind() != api.KindSteps || recs[1].RunID() != "r" || len(recs[1].Steps) != 3 {
		t.Fatalf("decoded %d records, second %q with %d steps", len(recs), recs[1].Kind(), len(recs[1].Steps))
	}
	flat := api.ExpandSteps(recs)
	if len(flat) != 4 || flat[0].Run == nil {
		t.Fatalf("expanded to %d records", len(flat))
	}
	for i, r := range flat[1:] {
		s := r.Step
		if s == nil || s.Kind != api.KindStep || s.RunID != "r" || s.Rank != 3 || *s.Step != int64(7+i) {
			t.Fatalf("step %d = %+v", i, s)
		}
		if *s.LR != 0.001 || *s.Samples != 32 || s.Metrics["lr_scale"] != 2 {
			t.Fatalf("step %d lost a value given once for all: %+v", i, s)
		}
		if float64(*s.StepMS) != 1.5+0.5*float64(i) || !s.Time.Equal(flat[1].Step.Time.Add(time.Duration(i)*500*time.Millisecond)) {
			t.Fatalf("step %d step_ms %v time %v", i, *s.StepMS, s.Time)
		}
	}
	a, b, c := flat[1].Step, flat[2].Step, flat[3].Step
	if a.ForwardMS != nil || *b.ForwardMS != 0.4 || c.ForwardMS != nil {
		t.Fatalf("forward_ms: null entries must leave the field out: %v %v %v", a.ForwardMS, b.ForwardMS, c.ForwardMS)
	}
	if !math.IsNaN(float64(*a.Loss)) || *b.Loss != 1.25 || !math.IsInf(float64(*c.Loss), 1) {
		t.Fatalf("loss %v %v %v", *a.Loss, *b.Loss, *c.Loss)
	}
	if a.SyncNS != nil || *c.SyncNS != 1735689601000000001 || !*b.Skipped || *a.Skipped {
		t.Fatalf("sync_ns %v / %v, skipped %v %v", a.SyncNS, c.SyncNS, *a.Skipped, *b.Skipped)
	}
	if _, ok := b.Metrics["acc"]; ok || a.Metrics["acc"] != 0.5 || c.Metrics["acc"] != 0.75 {
		t.Fatalf("metrics %v %v %v", a.Metrics, b.Metrics, c.Metrics)
	}
	// A batch without steps records is handed back as it is.
	plain := recs[:1]
	if got := api.ExpandSteps(plain); &got[0] != &plain[0] {
		t.Fatal("ExpandSteps copied a batch with no steps record")
	}
}

// Each step of a steps record is checked as a step record would be, and a
// column that does not fit the steps is refused: the error names the
// field, and which step for a bad value.
func TestDecodeStepsErrors(t *testing.T) {
	cases := []struct{ name, body, field, msg string }{
		{"no steps", `{"kind":"steps","run_id":"r","rank":0}`, "step", "missing"},
		{"empty", `{"kind":"steps","run_id":"r","rank":0,"step":[]}`, "step", "empty"},
		{"not an array", `{"kind":"steps","run_id":"r","rank":0,"step":5}`, "step", "want an array"},
		{"short column", `{"kind":"steps","run_id":"r","rank":0,"step":[1,2],"step_ms":[1]}`, "step_ms", "has 1 entries, step has 2"},
		{"short metric", `{"kind":"steps","run_id":"r","rank":0,"step":[1,2],"metrics":{"a":[1,2,3]}}`, "metrics.a", "has 3 entries"},
		{"run ids", `{"kind":"steps","run_id":["r","s"],"rank":0,"step":[1,2]}`, "run_id", "not an array"},
		{"negative duration", `{"kind":"steps","run_id":"r","rank":0,"step":[1,2],"data_ms":[0.5,-1]}`, "data_ms", "step 2 (entry 1): negative duration"},
		{"bad type", `{"kind":"steps","run_id":"r","rank":0,"step":[1,2],"loss":[1,"x"]}`, "loss", "step 2 (entry 1)"},
		{"bad step", `{"kind":"steps","run_id":"r","rank":0,"step":[1,-2]}`, "step", "step -2 (entry 1)"},
		{"no run", `{"kind":"steps","rank":0,"step":[1]}`, "run_id", "missing"},
		{"bad rank", `{"kind":"steps","run_id":"r","rank":-1,"step":[1]}`, "rank", "want 0 to"},
		{"metrics not an object", `{"kind":"steps","run_id":"r","rank":0,"step":[1],"metrics":[1]}`, "metrics", "want an object"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := `{"kind":"run","run_id":"r"}` + "\n" + c.body + "\n"
			recs, err := api.DecodeBatch([]byte(body))
			var re *api.RecordError
			if !errors.As(err, &re) {
				t.Fatalf("got %d records, err %v; want a record error", len(recs), err)
			}
			if re.Line != 2 || re.Index != 1 || re.Kind != api.KindSteps || re.Field != c.field || !strings.Contains(re.Msg, c.msg) {
				t.Fatalf("error %+v (%v); want line 2, kind steps, field %q, message with %q", re, re, c.field, c.msg)
			}
		})
	}
}

// BenchmarkDecodeSteps decodes the steps of 16 ranks, 64 each, as the
// hook sends them (one steps record a rank, "columns") and as one step
// record a step ("records"), and reports steps decoded a second: what the
// collector's receiver and ingest pay for the hook's smaller encoding.
func BenchmarkDecodeSteps(b *testing.B) {
	const ranks, n = 16, 64
	var cols, rows bytes.Buffer
	for r := 0; r < ranks; r++ {
		var step, tm, ms, loss []string
		for i := 0; i < n; i++ {
			s := 1000 + i
			t := 1735689600 + float64(i)*0.0025
			m := 2.1 + float64((i*7+r)%13)/100
			l := 0.7 + float64((i*3+r)%17)/1000
			step, tm, ms, loss = append(step, fmt.Sprint(s)), append(tm, fmt.Sprint(t)), append(ms, fmt.Sprint(m)),
				append(loss, fmt.Sprint(l))
			fmt.Fprintf(&rows, `{"kind":"step","run_id":"bench","rank":%d,"step":%d,"time":%v,"step_ms":%v,"loss":%v,"lr":2e-05,"samples":32,"tokens":8192}`+"\n",
				r, s, t, m, l)
		}
		fmt.Fprintf(&cols, `{"kind":"steps","run_id":"bench","rank":%d,"step":[%s],"time":[%s],"step_ms":[%s],"loss":[%s],"lr":2e-05,"samples":32,"tokens":8192}`+"\n",
			r, strings.Join(step, ","), strings.Join(tm, ","), strings.Join(ms, ","), strings.Join(loss, ","))
	}
	for _, c := range []struct {
		name string
		body []byte
	}{{"columns", cols.Bytes()}, {"records", rows.Bytes()}} {
		b.Run(c.name, func(b *testing.B) {
			recs, err := api.DecodeBatch(c.body)
			if err != nil {
				b.Fatal(err)
			}
			if got := len(api.ExpandSteps(recs)); got != ranks*n {
				b.Fatalf("%d steps, want %d", got, ranks*n)
			}
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				if _, err := api.DecodeBatch(c.body); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(ranks*n)*float64(b.N)/b.Elapsed().Seconds(), "steps/s")
		})
	}
}

// Every cut and every changed byte of a steps record decodes or is
// refused with a record error: the scan of its bytes never panics and
// never lets through what a step record would refuse.
func TestDecodeStepsMangled(t *testing.T) {
	good := `{"kind":"steps","run_id":"r","rank":0,"step":[1,2,3],"time":[1735689600,"2025-01-01T00:00:01Z",null],` +
		`"step_ms":[1.5, NaN ,2],"lr":0.1,"metrics":{"a\u00e9":[1,null,-Infinity],"b":2},"skipped":[true,false,null]}`
	if recs, err := api.DecodeBatch([]byte(good)); err != nil || len(api.ExpandSteps(recs)) != 3 {
		t.Fatalf("the record itself: %v", err)
	}
	for i := 0; i <= len(good); i++ {
		for _, body := range []string{good[:i], good[:i] + "x" + good[min(i+1, len(good)):], good[:i] + `"` + good[i:]} {
			recs, err := api.DecodeBatch([]byte(body))
			var re *api.RecordError
			if err != nil && !errors.As(err, &re) && !errors.Is(err, api.ErrEmptyBatch) {
				t.Fatalf("%q: %v is no record error", body, err)
			}
			for _, r := range api.ExpandSteps(recs) {
				if r.Step != nil && (r.Step.RunID == "" || r.Step.Step == nil) {
					t.Fatalf("%q gave a step without run or number: %+v", body, r.Step)
				}
			}
		}
	}
}
