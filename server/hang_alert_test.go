package server

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// hangLine is a hang event as the hook's watchdog sends it.
func hangLine(run string, rank, step int, at time.Time, collective string, completed bool, seq int) string {
	text, _ := json.Marshal(map[string]any{"reason": "stalled", "rank": rank, "step": step, "in_step": true,
		"last_collective": map[string]any{"name": collective, "seq": seq, "step": step, "completed": completed},
		"threads":         []map[string]string{{"name": "MainThread", "stack": "  File \"train.py\", line 9, in <module>\n"}}})
	return fmt.Sprintf(`{"kind":"event","run_id":%q,"rank":%d,"step":%d,"time":%q,"type":"hang","text":%q}`,
		run, rank, step, at.UTC().Format(time.RFC3339Nano), text)
}

// Rank 1 stopped inside a collective at step 20 that rank 0 never joined;
// rank 0's host went on to step 25 before it too waited. The hang alert
// names rank 1, and resolves when steps come again. Then both stop on one
// step, rank 1 after fewer collectives: it is named again.
func TestAlertHangNamesTheRankThatStoppedFirst(t *testing.T) {
	r := alertServer(t)
	t0 := time.Now().Add(-2 * time.Minute)
	var lines []string
	for step := 1; step <= 19; step++ {
		for rank := range 2 {
			lines = append(lines, stepLine("hung", rank, step, t0.Add(time.Duration(step)*time.Second), "2.5", ""))
		}
	}
	at := t0.Add(50 * time.Second)
	lines = append(lines, hangLine("hung", 1, 20, at, "all_reduce", false, 362),
		hangLine("hung", 0, 25, at.Add(time.Second), "all_reduce (DDP)", false, 400))
	ingestLines(t, r, lines)
	a := lifecycle(t, r, "hung", api.AlertHang, func() {
		var more []string
		for step := 20; step <= 22; step++ {
			for rank := range 2 {
				more = append(more, stepLine("hung", rank, step, at.Add(time.Duration(step)*time.Second), "2.4", ""))
			}
		}
		ingestLines(t, r, more)
	})
	if a.Rank == nil || *a.Rank != 1 || a.Step == nil || *a.Step != 20 {
		t.Fatalf("hang alert names rank %v step %v; want rank 1 at step 20: %s", a.Rank, a.Step, a.Text)
	}
	for _, want := range []string{"rank 1 stopped first", "rank 0 on step 25, waiting in all_reduce (DDP)",
		"rank 1 on step 20, waiting in all_reduce"} {
		if !strings.Contains(a.Text, want) {
			t.Errorf("hang alert text %q lacks %q", a.Text, want)
		}
	}

	at = at.Add(time.Minute)
	ingestLines(t, r, []string{hangLine("hung", 0, 23, at, "all_reduce (DDP)", false, 381),
		hangLine("hung", 1, 23, at, "all_reduce", false, 362)})
	waitFor(t, "the second hang alert", func() bool { return len(listAlerts(t, r, "run_id=hung&kind=hang&state=open")) == 1 })
	b := listAlerts(t, r, "run_id=hung&kind=hang&state=open")[0]
	if b.Rank == nil || *b.Rank != 1 || !strings.Contains(b.Text, "rank 1 stopped first") {
		t.Fatalf("second hang alert names rank %v: %s; want rank 1", b.Rank, b.Text)
	}
}

// A hang event older than the run's newest step is history: no alert.
// The run's NaN loss opens its own alert, which shows the run was
// evaluated.
func TestAlertHangIgnoresEventsBeforeTheNewestStep(t *testing.T) {
	r := alertServer(t)
	t0 := time.Now().Add(-2 * time.Minute)
	lines := []string{hangLine("resumed", 0, 3, t0.Add(3*time.Second), "all_reduce", false, 40)}
	for step := 1; step <= 10; step++ {
		loss := "2.5"
		if step == 10 {
			loss = "NaN"
		}
		lines = append(lines, stepLine("resumed", 0, step, t0.Add(time.Duration(step)*time.Second), loss, ""),
			stepLine("resumed", 1, step, t0.Add(time.Duration(step)*time.Second), "2.5", ""))
	}
	ingestLines(t, r, lines)
	waitFor(t, "the non-finite alert", func() bool {
		return len(listAlerts(t, r, "run_id=resumed&kind="+api.AlertNonFinite)) == 1
	})
	waitPasses(t, r, 3)
	if got := listAlerts(t, r, "run_id=resumed&kind="+api.AlertHang); len(got) != 0 {
		t.Fatalf("hang alerts %+v; want none", got)
	}
}

// A recorded run sent after the fact (the hook's offline file, through
// deepseed import: POST /ingest), three days old and ended: its hang
// reports open the hang alert as they do live, naming the rank that
// stopped first.
func TestAlertHangOfARunImportedAfterTheFact(t *testing.T) {
	r := alertServer(t)
	const run = "hung-recorded"
	t0 := time.Now().Add(-72 * time.Hour)
	lines := []string{fmt.Sprintf(`{"kind":"run","run_id":%q,"time":%q,"meta":{"world_size":2}}`, run, t0.UTC().Format(time.RFC3339Nano))}
	for step := 1; step <= 19; step++ {
		for rank := range 2 {
			lines = append(lines, stepLine(run, rank, step, t0.Add(time.Duration(step)*time.Second), "2.5", ""))
		}
	}
	at := t0.Add(50 * time.Second)
	lines = append(lines, hangLine(run, 1, 20, at, "all_reduce", false, 362),
		hangLine(run, 0, 25, at.Add(time.Second), "all_reduce (DDP)", false, 400),
		fmt.Sprintf(`{"kind":"end","run_id":%q,"time":%q,"status":"failed"}`, run, at.Add(2*time.Second).UTC().Format(time.RFC3339Nano)))
	ingestLines(t, r, lines)
	waitFor(t, "the hang alert of the imported run", func() bool {
		return len(listAlerts(t, r, "run_id="+run+"&kind="+api.AlertHang+"&state=open")) == 1
	})
	a := listAlerts(t, r, "run_id="+run+"&kind="+api.AlertHang)[0]
	if a.Rank == nil || *a.Rank != 1 || !strings.Contains(a.Text, "rank 1 stopped first") {
		t.Fatalf("hang alert of the imported run names rank %v: %s; want rank 1", a.Rank, a.Text)
	}
}
