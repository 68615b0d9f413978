package ingest_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/ingest"
)

// stepsLine is a steps record of run r, rank 0, for the given step numbers
// with one loss for all of them.
func stepsLine(steps []int) string {
	nums := make([]string, len(steps))
	for i, s := range steps {
		nums[i] = fmt.Sprint(s)
	}
	return `{"kind":"steps","run_id":"r","rank":0,"loss":1.5,"step":[` + strings.Join(nums, ",") + `]}`
}

func seq(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

// TestIngestRowsCap: a batch is bounded by the rows its records expand
// to, not by its records: ten steps records of 10,000 steps each are a
// few hundred kilobytes, 100,001 rows past a cap of 50,000, answered 413
// naming the cap and the flag, with nothing stored.
func TestIngestRowsCap(t *testing.T) {
	s := newServer(t, ingest.Options{MaxBatchRows: 50000})
	lines := []string{`{"kind":"run","run_id":"r","project":"p"}`}
	for i := range 10 {
		lines = append(lines, stepsLine(seq(i*10000, 10000)))
	}
	e := s.ingest(t, lines...).apiError(t, http.StatusRequestEntityTooLarge)
	for _, want := range []string{"50000 rows", "--max-batch-rows", "nothing stored", "line 6"} {
		if !strings.Contains(e.Error, want) {
			t.Errorf("413 message %q does not say %q", e.Error, want)
		}
	}
	if n := s.stored(t); n != 0 {
		t.Fatalf("a batch past the rows cap stored %d rows", n)
	}
	// One steps record alone past the cap is refused the same way.
	s.ingest(t, stepsLine(seq(0, 50001))).apiError(t, http.StatusRequestEntityTooLarge)
	// Exactly at the cap goes through, its rows counted as steps.
	res := s.ingest(t, lines[0], stepsLine(seq(0, 25000)), stepsLine(seq(25000, 24999))).result(t)
	if res.ByKind["step"] != 49999 {
		t.Fatalf("result = %+v", res)
	}
}

// TestIngestStepsRepeatedMerged: a steps record that repeats its steps
// (or sends them out of order) stores each step once, the first sent,
// and costs no more rows than its distinct steps.
func TestIngestStepsRepeatedMerged(t *testing.T) {
	s := newServer(t, ingest.Options{})
	rep := make([]int, 30000)
	for i := range rep {
		rep[i] = 7
	}
	line := `{"kind":"steps","run_id":"r","rank":0,"step":[9,7,8,7,9],"loss":[1,2,3,4,5]}`
	res := s.ingest(t, line, stepsLine(rep)).result(t)
	if res.ByKind["step"] != 3 {
		t.Fatalf("result = %+v, want the 3 distinct steps", res)
	}
	if n := s.count(t, `SELECT count(*) FROM steps`); n != 3 {
		t.Fatalf("stored %d steps, want 3", n)
	}
	if n := s.count(t, `SELECT count(*) FROM steps WHERE step = 7 AND loss = 2`); n != 1 {
		t.Fatal("step 7 is not the first sent of it")
	}
}

// TestIngestWideRecordsRefused: a record whose array or object holds
// millions of tiny entries (layer names, a metrics map, a gpu record's
// processes) is a 400 naming its field and the bound, and a JSON array of
// millions of tiny entries a 413 naming the rows bound; nothing stored.
func TestIngestWideRecordsRefused(t *testing.T) {
	s := newServer(t, ingest.Options{MaxBatchRows: 50000})
	rep := func(v string, n int) string { return strings.TrimSuffix(strings.Repeat(v+",", n), ",") }
	for _, c := range []struct {
		line, want string
	}{
		{`{"kind":"layers","run_id":"r","rank":0,"step":1,"names":[` + rep(`"a"`, 1_000_000) + `],"forward_ms":[1]}`, "names: more than 4096 entries"},
		{`{"kind":"step","run_id":"r","rank":0,"step":1,"metrics":{"a":1,` + rep(`"b":1`, 5000) + `}}`, "metrics: more than 4096 entries"},
		{`{"kind":"gpu","host":"h","gpu":0,"time":1735689600,"processes":[` + rep(`{}`, 100_000) + `]}`, "processes: more than 4096 entries"},
	} {
		e := s.ingest(t, `{"kind":"run","run_id":"r","project":"p"}`, c.line).apiError(t, http.StatusBadRequest)
		if !strings.Contains(e.Error, c.want) || !strings.Contains(e.Error, "line 2") {
			t.Errorf("400 message %q, want it to say line 2 and %q", e.Error, c.want)
		}
	}
	e := s.post(t, "/api/v1/ingest", []byte("["+rep("1", 1_000_000)+"]"), "Content-Type", "application/json").apiError(t, http.StatusRequestEntityTooLarge)
	if !strings.Contains(e.Error, "50000 rows") {
		t.Errorf("413 message %q does not name the rows bound", e.Error)
	}
	if n := s.stored(t); n != 0 {
		t.Fatalf("refused bodies stored %d rows", n)
	}
}
