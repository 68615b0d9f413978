package ingest_test

import (
	"bytes"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/internal/fuzztest"
)

// liveFuzzBases are valid batches of every kind, the starting points of
// the mutations.
var liveFuzzBases = []string{
	`{"kind":"run","run_id":"fz","project":"p","name":"n","config":{"lr":0.1,"zero":{"stage":2}},"params":{"a":[1,2]},"meta":{"model":"m","gpu":"H100","x":{"y":"z"}},"tags":["a","b"]}
{"kind":"step","run_id":"fz","rank":0,"step":1,"time":1000,"loss":2.5,"metrics":{"m":1}}
{"kind":"layers","run_id":"fz","rank":0,"step":1,"time":1000,"names":["a","b"],"forward_ms":[1,2],"backward_ms":[2,4]}`,
	`{"kind":"eval","run_id":"fz","step":1,"time":1000,"loss":1,"accuracy":0.5,"metrics":{"f":1}}
{"kind":"gpu","time":1000,"host":"h","gpu":0,"util_pct":50,"processes":[{"pid":1,"run_id":"fz","rank":0}]}
{"kind":"host","time":1000,"host":"h","cpu_util_pct":5,"processes":[{"pid":1,"run_id":"fz"}]}`,
	`{"kind":"memory","run_id":"fz","rank":0,"parameters_bytes":1,"gradients_bytes":2,"optimizer_bytes":3}
{"kind":"event","run_id":"fz","type":"note","text":"hello"}
{"kind":"end","run_id":"fz","status":"finished","summary":{"loss":1.5,"best":{"step":3}}}`,
	`[{"kind":"step","run_id":"fz","rank":1,"step":2,"time":"2025-01-01T00:00:00Z","loss":NaN}]`,
}

// Mutated bodies posted to a live server never get a 5xx: every one is
// stored or refused with a 4xx. DEEPSEED_FUZZ_TRIES sets the count (the
// default keeps the suite quick).
func TestIngestMutatedBodiesNever5xx(t *testing.T) {
	tries := 1500
	if v, err := strconv.Atoi(os.Getenv("DEEPSEED_FUZZ_TRIES")); err == nil && v > 0 {
		tries = v
	}
	s := newServer(t, ingest.Options{})
	rng := rand.New(rand.NewPCG(11, 42))
	statuses := map[int]int{}
	for i := 0; i < tries; i++ {
		body := []byte(liveFuzzBases[rng.IntN(len(liveFuzzBases))])
		body = fuzztest.MutateSome(rng, body)
		resp, err := http.Post(s.URL+"/api/v1/ingest", "application/x-ndjson", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("try %d: %v", i, err)
		}
		resp.Body.Close()
		statuses[resp.StatusCode]++
		if resp.StatusCode >= 500 {
			t.Errorf("try %d: %d for %.300q", i, resp.StatusCode, body)
		}
	}
	t.Logf("%d mutated bodies: answers %v", tries, statuses)
}

// importFuzzBases are valid exports (the seed notebook's
// training_metrics.json shapes), the starting points of the mutations.
var importFuzzBases = []string{
	`{"meta":{"model":"bert","fp16":true,"zero_stage":2,"batch_size":8,"world_size":2},
	"steps":[{"step":1,"timestamp":"2025-01-01T00:00:00Z","loss":0.7,"lr":2e-5,"forward_ms":10.5,"backward_ms":20.25,"optimizer_ms":3,
	"layer_times":{"embeddings":{"forward_ms":1.1,"backward_ms":2.2},"encoder.0":{"forward_ms":2.1,"backward_ms":4.2}}},
	{"step":2,"timestamp":"2025-01-01T00:00:01Z","loss":0.69,"gpu_util":97,"gpu_memory_gb":9.5}],
	"evaluations":[{"step":2,"loss":0.6,"accuracy":0.7}],
	"zero_memory":{"parameters_gb":0.25,"gradients_gb":0.25,"optimizer_gb":1.5}}`,
	`{"meta":{"model":"gpt2","fp16":false,"total_time_minutes":10},
	"steps":[{"step":0,"loss":NaN,"data_load_ms":4,"layer_times":{"wte":1.0,"h.0":2.0},"my_metric":3},
	{"step":10,"loss":2.0,"layer_times":{"wte":{"forward_ms":1.1,"backward_ms":2.2},"h.0":{"forward_ms":2.1,"backward_ms":4.2}}}],
	"evaluations":[{"step":10,"loss":1.9,"accuracy":0.3}]}`,
}

// Mutated exports posted to the importer of a live server never get a
// 5xx, under hostile query parameters too. DEEPSEED_FUZZ_TRIES sets the
// count.
func TestImportMutatedBodiesNever5xx(t *testing.T) {
	tries := 600
	if v, err := strconv.Atoi(os.Getenv("DEEPSEED_FUZZ_TRIES")); err == nil && v > 0 {
		tries = v
	}
	s := newServer(t, ingest.Options{})
	rng := rand.New(rand.NewPCG(3, 9))
	queries := []string{"", "?project=p&name=n", "?run_id=fz-import", "?project=a%00b", "?name=%ff%fe", "?run_id=" + strings.Repeat("r", 300),
		"?project='%3B+DROP+TABLE+runs%3B+--"}
	statuses := map[int]int{}
	for i := 0; i < tries; i++ {
		body := []byte(importFuzzBases[rng.IntN(len(importFuzzBases))])
		body = fuzztest.MutateSome(rng, body)
		q := queries[rng.IntN(len(queries))]
		resp, err := http.Post(s.URL+"/api/v1/import"+q, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("try %d: %v", i, err)
		}
		resp.Body.Close()
		statuses[resp.StatusCode]++
		if resp.StatusCode >= 500 {
			t.Errorf("try %d: import%s: %d for %.300q", i, q, resp.StatusCode, body)
		}
	}
	t.Logf("%d mutated exports: answers %v", tries, statuses)
}
