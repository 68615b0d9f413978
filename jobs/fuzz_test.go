package jobs_test

import (
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/internal/fuzztest"
)

// jobsFuzzBases are valid requests to every route that writes, the
// starting points of the mutations.
var jobsFuzzBases = []struct{ method, path, token, body string }{
	{"POST", "/api/v1/jobs", submitTok, `{"project":"p","argv":["python","train.py","--lr","{lr}"],"params":{"lr":"1e-4"},"gpus":1,"retries":1}`},
	{"POST", "/api/v1/sweeps", submitTok, `{"project":"p","argv":["python","train.py","--lr","{lr}","--bs","{bs}"],"params":{"lr":"1e-5,2e-5","bs":"8,16"},"gpus":1,"metric":"loss","goal":"min"}`},
	{"POST", "/api/v1/sweeps", submitTok, `{"project":"p","argv":["python","t.py"],"params":{"lr":"log:1e-5:1e-3","wd":"0:0.1"},"trials":3,"seed":7}`},
	{"PUT", "/api/v1/quotas/p", submitTok, `{"gpu_hours":30}`},
	{"POST", "/api/v1/agents/node1/heartbeat", agentTok, `{"host":"h","gpus":[0,1],"executor":"local","projects":["p"],"running":[1],"version":"1"}`},
	{"POST", "/api/v1/agents/node1/claim", agentTok, `{"free_gpus":[0,1],"projects":["p"],"executor":"local"}`},
	{"POST", "/api/v1/agents/node1/jobs/1", agentTok, `{"state":"running","external_id":"123","detail":"started"}`},
	{"POST", "/api/v1/agents/node1/jobs/1", agentTok, `{"state":"failed","exit_code":1,"output_tail":"Traceback","detail":"exit 1"}`},
}

// Mutated bodies to the jobs API's write routes (submit, sweeps, quotas,
// agents' heartbeats, claims and reports) never get a 5xx from a live
// server: each is taken or refused with a 4xx, and the server keeps
// answering. DEEPSEED_FUZZ_TRIES sets the count.
func TestJobsMutatedBodiesNever5xx(t *testing.T) {
	tries := 800
	if v, err := strconv.Atoi(os.Getenv("DEEPSEED_FUZZ_TRIES")); err == nil && v > 0 {
		tries = v
	}
	e := start(t)
	e.beat(t, "node1", 2)
	// The project must exist for its quota; a first job makes it.
	e.must(t, "POST", "/api/v1/jobs", submitTok, jobsFuzzBases[0].body, 201, nil)
	rng := rand.New(rand.NewPCG(5, 17))
	statuses := map[int]int{}
	for i := 0; i < tries; i++ {
		base := jobsFuzzBases[rng.IntN(len(jobsFuzzBases))]
		body := []byte(base.body)
		body = fuzztest.MutateSome(rng, body)
		code, answer := e.do(t, base.method, base.path, base.token, string(body))
		statuses[code]++
		if code >= 500 {
			t.Errorf("try %d: %s %s: %d %s for %.300q", i, base.method, base.path, code, answer, body)
		}
	}
	// Still serving, and reading what was taken works.
	for _, p := range []string{"/api/v1/jobs", "/api/v1/quotas", "/api/v1/agents"} {
		if code, answer := e.do(t, "GET", p, readTok, ""); code != 200 {
			t.Errorf("GET %s after the fuzzing: %d %s", p, code, answer)
		}
	}
	t.Logf("%d mutated bodies: answers %v", tries, statuses)
	if statuses[400]+statuses[404]+statuses[409]+statuses[413]+statuses[422] == 0 || !strings.Contains(jobsFuzzBases[0].body, "argv") {
		t.Errorf("no mutation was refused: %v", statuses)
	}
}
