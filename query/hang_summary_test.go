package query_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// A hang annotation reads as a sentence: who stopped first, where, and
// each rank's last collective, the hang alert's words; the hook's report
// (every thread's stack) stays in its text. Rank 1 stopped in its data
// loader outside any collective at step 20 while rank 0 waits inside one;
// rank 2 sent no report after it finished step 20.
func TestHangAnnotationSaysWhoStoppedFirst(t *testing.T) {
	e := newEnv(t)
	recs := []api.Record{runRec("hung", nil)}
	for step := int64(1); step <= 19; step++ {
		for rank := range 3 {
			recs = append(recs, stepRec("hung", rank, step, nil))
		}
	}
	report := func(rank int, completed bool, seq int) api.Record {
		text, _ := json.Marshal(map[string]any{"reason": "stalled", "rank": rank, "step": 20,
			"last_collective": map[string]any{"name": "all_reduce", "seq": seq, "completed": completed},
			"threads":         []map[string]string{{"name": "MainThread", "stack": "  File \"train.py\", line 9, in <module>\n"}}})
		return api.Record{Event: &api.Event{Kind: "event", RunID: "hung", Time: api.T(t0.Add(time.Duration(80+rank) * time.Second)),
			Step: api.Ptr(int64(20)), Rank: api.Ptr(rank), Type: api.EventHang, Text: string(text)}}
	}
	recs = append(recs, stepRec("hung", 2, 20, nil))
	e.write(append(recs, report(0, false, 40), report(1, true, 39))...)

	var res api.AnnotationsResponse
	e.get("/annotations?run_id=hung&type=hang", 200, &res)
	if len(res.Annotations) != 2 {
		t.Fatalf("%d hang annotations, want 2: %+v", len(res.Annotations), res.Annotations)
	}
	last := res.Annotations[1]
	for _, want := range []string{"rank 1 stopped first", "rank 0 on step 20, waiting in all_reduce (its collective 40)",
		"rank 1 on step 20, outside any collective (its last, all_reduce, completed)", "rank 2 on step 21 (no hang report: its newest step is 20)",
		"Hang reports table"} {
		if !strings.Contains(last.Summary, want) {
			t.Errorf("summary %q lacks %q", last.Summary, want)
		}
	}
	if !strings.Contains(last.Text, "MainThread") {
		t.Errorf("text %q: the report with its stacks is gone", last.Text)
	}
	// The first report alone: rank 1's report came after it, so rank 1
	// is read from its steps.
	if first := res.Annotations[0].Summary; !strings.Contains(first, "stopped first") || strings.Contains(first, "outside any collective") {
		t.Errorf("first report's summary %q: want only what was known at its time", first)
	}
}
