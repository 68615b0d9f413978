package api

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// repeat joins n copies of s with commas.
func repeat(s string, n int) string { return strings.TrimSuffix(strings.Repeat(s+",", n), ",") }

// Records whose arrays or objects hold millions of tiny entries are
// refused with the field and the bound before they are decoded: each took
// 20 to 70 times its bytes to decode (a 29 MiB layers record 1.4 GB, a
// 29 MiB array of numbers 2 GB) before its bound was checked, and an
// object of two million keys kept a CPU busy for minutes. Now the decoder
// allocates no more than the body's size for any of them.
func TestRecordsThatExpandAreRefusedBeforeDecoding(t *testing.T) {
	metricsObj := func(n int) string {
		var b strings.Builder
		for i := 0; i < n; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"m%d":1`, i)
		}
		return b.String()
	}
	cases := []struct {
		name, body string
		rows       bool   // refused as past the batch's rows
		field      string // else refused naming this field
	}{
		{"layers of 2M names", `{"kind":"layers","run_id":"r","rank":1,"step":2,"names":[` + repeat(`"a"`, 2_000_000) + `],"forward_ms":[` + repeat("1", 2_000_000) + "]}\n", false, "names"},
		{"layers of 2M times, few names", `{"kind":"layers","run_id":"r","rank":1,"step":2,"names":["a"],"forward_ms":[` + repeat("1", 2_000_000) + "]}\n", false, "forward_ms"},
		{"array body of 4M numbers", "[" + repeat("1", 4_000_000) + "]", true, ""},
		{"array body of 4M empty objects", "[" + repeat("{}", 4_000_000) + "]", true, ""},
		{"array body of 200k steps", "[" + repeat(`{"kind":"step","run_id":"r","step":1}`, 200_000) + "]", true, ""},
		{"step metrics of 500k keys", `{"kind":"step","run_id":"r","step":1,"metrics":{` + metricsObj(500_000) + "}}\n", false, "metrics"},
		{"eval metrics of 500k keys", `{"kind":"eval","run_id":"r","step":1,"split":"val","metrics":{` + metricsObj(500_000) + "}}\n", false, "metrics"},
		{"gpu of 1M processes", `{"kind":"gpu","host":"h","gpu":0,"time":1735689600,"processes":[` + repeat(`{}`, 1_000_000) + "]}\n", false, "processes"},
		{"run of 2M tags", `{"kind":"run","run_id":"r","tags":[` + repeat(`"a"`, 2_000_000) + "]}\n", false, "tags"},
		{"run meta of 500k versions", `{"kind":"run","run_id":"r","meta":{"versions":{` + strings.ReplaceAll(metricsObj(500_000), ":1", `:"1"`) + "}}}\n", false, "meta"},
		{"steps column of 2M", `{"kind":"steps","run_id":"r","step":[1],"metrics":{"a":[` + repeat("1", 2_000_000) + "]}}\n", true, ""},
		{"steps of 2M steps", `{"kind":"steps","run_id":"r","step":[` + repeat("1", 2_000_000) + "]}\n", true, ""},
		{"nested 5,000 deep", `{"kind":"event","run_id":"r","type":"note","x":` + strings.Repeat("[", 5_000) + strings.Repeat("]", 5_000) + "}\n", false, "x"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := []byte(c.body)
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			recs, err := DecodeBatchWithin(body, 50_000)
			runtime.ReadMemStats(&after)
			if err == nil {
				t.Fatalf("%d records decoded, want the body refused", len(recs))
			}
			var rows *RowsError
			var re *RecordError
			switch {
			case c.rows && !errors.As(err, &rows):
				t.Errorf("error %q, want the batch's rows bound", err)
			case !c.rows && (!errors.As(err, &re) || re.Field != c.field):
				t.Errorf("error %q, want one naming field %q", err, c.field)
			}
			// The general path's JSON scanner keeps a stack as deep as the
			// text's nesting, which it bounds: a megabyte covers it.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(len(body))+1<<20 {
				t.Errorf("decoding a %d-byte body allocated %d bytes before refusing it", len(body), alloc)
			}
		})
	}
}

// What the bounds leave alone decodes as before: a layers record of
// MaxLayers layers, a steps record of many steps, and a config holding an
// array wider than any field's bound, which is kept as sent.
func TestRecordsWithinTheBoundsDecode(t *testing.T) {
	names := make([]string, MaxLayers)
	for i := range names {
		names[i] = fmt.Sprintf(`"l%d"`, i)
	}
	bodies := []string{
		`{"kind":"layers","run_id":"r","rank":1,"step":2,"names":[` + strings.Join(names, ",") + `],"forward_ms":[` + repeat("1", MaxLayers) + "]}",
		`{"kind":"steps","run_id":"r","step":[` + repeat("1", 1) + "," + repeat("2", 1) + `],"loss":[1,2]}`,
		`{"kind":"run","run_id":"r","config":{"vocab":[` + repeat("7", 3*MaxEntries) + `]}}`,
	}
	for _, b := range bodies {
		recs, err := DecodeBatchWithin([]byte(b+"\n"), 50_000)
		if err != nil || len(recs) != 1 {
			t.Errorf("%.80s…: %d records, %v; want it decoded", b, len(recs), err)
		}
	}
	var steps bytes.Buffer
	steps.WriteString(`{"kind":"steps","run_id":"r","step":[`)
	for i := 0; i < 2*MaxEntries; i++ {
		if i > 0 {
			steps.WriteByte(',')
		}
		fmt.Fprint(&steps, i)
	}
	steps.WriteString(`],"loss":[` + repeat("1", 2*MaxEntries) + "]}\n")
	recs, err := DecodeBatchWithin(steps.Bytes(), 50_000)
	if err != nil || len(recs) != 1 || len(recs[0].Steps) != 2*MaxEntries {
		t.Errorf("steps record of %d steps: %v, %v; want it decoded", 2*MaxEntries, len(recs), err)
	}
}

// A wide object's repeated key is found as in a narrow one, escaped or
// not, once its keys are kept in a set.
func TestDuplicateKeyInAWideObject(t *testing.T) {
	keys := make([]string, 3*wideObject)
	for i := range keys {
		keys[i] = fmt.Sprintf(`"k%d":1`, i)
	}
	wide := "{" + strings.Join(keys, ",")
	for _, c := range []struct{ raw, dup string }{
		{wide + "}", ""},
		{wide + `,"k3":2}`, "k3"},
		{wide + `,"\u006b7":2}`, "k7"},
		{wide + `,"x":{"k3":1,"k3":2}}`, "k3"},
		{wide + `,"x":{"k3":1},"k4x":3}`, ""},
	} {
		if got := DuplicateKey([]byte(c.raw)); got != c.dup {
			t.Errorf("%.40s…%s: %q, want %q", c.raw, c.raw[len(wide):], got, c.dup)
		}
	}
}
