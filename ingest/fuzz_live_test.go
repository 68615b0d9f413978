package ingest_test

import (
	"bytes"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
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
		for m := 0; m <= rng.IntN(3); m++ {
			body = fuzztest.Mutate(rng, body)
		}
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
