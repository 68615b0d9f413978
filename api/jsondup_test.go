package api

import (
	"strings"
	"testing"
)

func TestDuplicateKey(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"a":1,"b":2}`, ""},
		{`{"a":1,"a":2}`, "a"},
		{`{"a":{"b":1},"c":{"b":2}}`, ""}, // one key in two objects
		{`{"a":{"b":1,"b":2}}`, "b"},
		{`[{"a":1},{"a":2}]`, ""},
		{`{"a":[{"x":1,"y":[1,{"x":2}]}],"x":3}`, ""},
		{`{"a":[{"x":1,"x":[1]}]}`, "x"},
		{`{"k":"a","a":"k"}`, ""}, // values are not keys
		{`{"s":"{\"a\":1,\"a\":2}"}`, ""},
		{`{"a\"b":1,"a\"b":2}`, `a"b`},
		{`{"lr":1,"\u006cr":2}`, "lr"},
		{`{"a":NaN,"b":Infinity,"a":-Infinity}`, "a"},
		{`{}`, ""},
		{`"a"`, ""},
	} {
		if got := DuplicateKey([]byte(c.in)); got != c.want {
			t.Errorf("DuplicateKey(%s) = %q, want %q", c.in, got, c.want)
		}
	}
}

// Both decoding paths refuse a repeated key, wherever it is: the fast one
// gives up and the general one says which key.
func TestDecodeRefusesRepeatedKeys(t *testing.T) {
	for _, line := range []string{
		`{"kind":"step","run_id":"r","rank":0,"step":1,"loss":1,"loss":2}`,
		`{"kind":"step","run_id":"r","run_id":"s","rank":0,"step":1}`,
		`{"kind":"step","run_id":"r","step":1,"metrics":{"a":1,"a":2}}`,
		`{"kind":"eval","run_id":"r","step":1,"metrics":{"bleu":1,"bleu":2}}`,
		`{"kind":"layers","run_id":"r","rank":0,"step":1,"names":["a"],"forward_ms":[1],"forward_ms":[2]}`,
		`{"kind":"gpu","time":1,"host":"h","gpu":0,"util_pct":1,"util_pct":2}`,
		`{"kind":"run","run_id":"r","project":"p","meta":{"model":"a","model":"b"}}`,
		`{"kind":"kind","kind":"step","run_id":"r","step":1}`,
	} {
		for _, body := range []string{line + "\n", "[" + line + "]"} {
			_, err := DecodeBatch([]byte(body))
			if err == nil || !strings.Contains(err.Error(), "appears twice") {
				t.Errorf("DecodeBatch(%s) = %v; want a repeated-key error", body, err)
			}
		}
	}
}

// BenchmarkDuplicateKey checks one GPU sample, the commonest record the
// general decoding path reads (it decodes in about 10 µs).
func BenchmarkDuplicateKey(b *testing.B) {
	rec := []byte(`{"kind":"gpu","time":1735689600.5,"host":"node-3","gpu":3,"uuid":"GPU-0000002a","name":"NVIDIA H100 80GB HBM3",` +
		`"run_id":"bench-run","util_pct":42,"mem_used_bytes":45097156608,"mem_total_bytes":85899345920,"power_w":612.5,"temp_c":67,` +
		`"sm_clock_mhz":1980,"mem_clock_mhz":2619,"pcie_tx_bytes":123456789,"pcie_rx_bytes":987654321}`)
	b.SetBytes(int64(len(rec)))
	for b.Loop() {
		if DuplicateKey(rec) != "" {
			b.Fatal("duplicate")
		}
	}
}
