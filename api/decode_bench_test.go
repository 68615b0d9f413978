package api_test

import (
	"bytes"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// benchBatch builds an NDJSON batch shaped like what the collector sends
// every few seconds: 25 steps of 16 ranks, each a step record with 19
// fields and a layers record of 26 layers, and an evaluation every 200
// steps. Steps are written the way Python's json module writes them when
// python is set (", " and ": " separators, time as fractional seconds),
// otherwise compactly with RFC 3339 times as the Go senders do.
func benchBatch(from int, python bool) []byte {
	var b bytes.Buffer
	sep, col := ",", ":"
	if python {
		sep, col = ", ", ": "
	}
	names := make([]string, 26)
	for i := range names {
		switch {
		case i == 0:
			names[i] = "embeddings"
		case i == len(names)-1:
			names[i] = "classifier"
		default:
			names[i] = fmt.Sprintf("encoder.%d", i-1)
		}
	}
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	kv := func(first bool, k string, v any) {
		if !first {
			b.WriteString(sep)
		}
		fmt.Fprintf(&b, "%q%s%v", k, col, v)
	}
	for s := from; s < from+25; s++ {
		t := start.Add(time.Duration(s) * 550 * time.Millisecond)
		var ts any = fmt.Sprintf("%q", t.Format(time.RFC3339Nano))
		if python {
			ts = float64(t.UnixNano()) / 1e9
		}
		loss := 0.7*math.Exp(-float64(s)/1500) + 0.25
		for r := 0; r < 16; r++ {
			j := float64((s*31+r*17)%100) / 1000
			b.WriteString("{")
			kv(true, "kind", `"step"`)
			kv(false, "run_id", `"bench-run"`)
			kv(false, "rank", r)
			kv(false, "step", s)
			kv(false, "time", ts)
			kv(false, "epoch", float64(s)/1563)
			kv(false, "loss", loss+j/10)
			kv(false, "lr", 2e-05)
			kv(false, "grad_norm", 0.6+j)
			kv(false, "loss_scale", 65536)
			kv(false, "samples", s*16)
			kv(false, "throughput_sps", 23.5+j)
			kv(false, "step_ms", 172+j)
			kv(false, "forward_ms", 48+j)
			kv(false, "backward_ms", 92+j)
			kv(false, "optimizer_ms", 28+j)
			kv(false, "comm_ms", 3.1)
			kv(false, "data_ms", 4.2)
			kv(false, "gpu_util_pct", 96)
			kv(false, "gpu_mem_used_gb", 10.5+j)
			b.WriteString("}\n{")
			kv(true, "kind", `"layers"`)
			kv(false, "run_id", `"bench-run"`)
			kv(false, "rank", r)
			kv(false, "step", s)
			kv(false, "time", ts)
			b.WriteString(sep + `"names"` + col + "[")
			for i, n := range names {
				if i > 0 {
					b.WriteString(sep)
				}
				fmt.Fprintf(&b, "%q", n)
			}
			for _, f := range []struct {
				key   string
				scale float64
			}{{"forward_ms", 1}, {"backward_ms", 1.9}} {
				b.WriteString("]" + sep + `"` + f.key + `"` + col + "[")
				for i := range names {
					if i > 0 {
						b.WriteString(sep)
					}
					fmt.Fprintf(&b, "%v", (1.8+float64(i%7)/10+j)*f.scale)
				}
			}
			b.WriteString("]}\n")
		}
		if s%200 == 0 {
			b.WriteString("{")
			kv(true, "kind", `"eval"`)
			kv(false, "run_id", `"bench-run"`)
			kv(false, "step", s)
			kv(false, "time", ts)
			kv(false, "split", `"val"`)
			kv(false, "loss", loss-0.05)
			kv(false, "accuracy", 0.5+0.4*(1-math.Exp(-float64(s)/2000)))
			kv(false, "f1", "NaN")
			b.WriteString("}\n")
		}
	}
	return b.Bytes()
}

// BenchmarkDecodeBatch decodes an 800-record NDJSON batch (801 with its
// evaluation): the per-batch CPU cost of the ingest handler and of the
// collector's hook receiver before any database work.
func BenchmarkDecodeBatch(b *testing.B) {
	for _, style := range []struct {
		name   string
		python bool
	}{{"go", false}, {"python", true}} {
		b.Run(style.name, func(b *testing.B) {
			body := benchBatch(0, style.python)
			recs, err := api.DecodeBatch(body)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := api.DecodeBatch(body); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(recs))*float64(b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}
