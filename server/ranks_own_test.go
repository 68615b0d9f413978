package server

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// glooLine is a step of DDP over gloo as the hook records it: the
// collectives block the host, so a rank that waits for a slow peer does
// so inside its forward (DDP broadcasts buffers there) and every rank
// reaches the end of backward together, with a wait of a fraction of a
// millisecond. dataMS is the rank's own input time, fwdMS its forward.
func glooLine(run string, rank, step int, t0 time.Time, dataMS, fwdMS, hostMS float64) string {
	base := t0.Add(time.Duration(step) * 100 * time.Millisecond)
	stepMS := dataMS + fwdMS + 30 + 5 + hostMS + 0.2
	return fmt.Sprintf(`{"kind":"step","run_id":%q,"rank":%d,"step":%d,"time":%q,"loss":2.5,"step_ms":%g,"data_ms":%g,`+
		`"forward_ms":%g,"backward_ms":30,"optimizer_ms":5,"sync_ns":%d,"sync_wait_ms":0.2,"input_wait_ms":0}`,
		run, rank, step, base.UTC().Format(time.RFC3339Nano), stepMS, dataMS, fwdMS, base.UnixNano()+int64(float64(rank)*0.1e6))
}

// DDP over gloo with rank 1's input 40 ms late every step: lateness
// reads about zero for both ranks (the measurement), and /ranks
// still names rank 1, by its own work, with cause data, and shows rank
// 0's 40 ms wait hidden in its forward; the straggler alert names rank 1
// with the cause, and resolves once rank 1's input is on time.
func TestStragglerNamedByOwnWorkUnderHostBlockingCollectives(t *testing.T) {
	r := alertServer(t)
	const run = "gloo-data"
	t0 := time.Now().Add(-time.Minute)
	steps := func(from, to int, late float64) {
		var lines []string
		for step := from; step <= to; step++ {
			// Rank 0 waits for rank 1's late input inside its forward.
			lines = append(lines, glooLine(run, 0, step, t0, 0.6, 8+late, 5),
				glooLine(run, 1, step, t0, 0.6+late, 8, 5))
		}
		ingestLines(t, r, lines)
	}
	steps(1, 60, 40.4)
	a := lifecycle(t, r, run, api.AlertStraggler, func() {
		code, b, _ := do(t, "GET", r.url+"/api/v1/runs/"+run+"/ranks?from_step=1", "", "")
		var rk api.RanksResponse
		if code != 200 || json.Unmarshal(b, &rk) != nil || len(rk.Ranks) != 2 {
			t.Fatalf("GET /ranks = %d %s", code, b)
		}
		if rk.OwnThresholdMS == nil || float64(*rk.OwnThresholdMS) < 1 {
			t.Errorf("own_threshold_ms %v", rk.OwnThresholdMS)
		}
		for _, s := range rk.Ranks {
			if s.LatenessMS == nil || float64(*s.LatenessMS) > 1 {
				t.Errorf("rank %d lateness %v: the fixture is one where lateness sees nothing", s.Rank, s.LatenessMS)
			}
		}
		r0, r1 := rk.Ranks[0], rk.Ranks[1]
		if !r1.Straggler || r1.StragglerBy != "own_work" || r1.OwnCause != "data" {
			t.Errorf("rank 1: straggler %v by %q cause %q; want a data straggler named by own work", r1.Straggler, r1.StragglerBy, r1.OwnCause)
		}
		if r1.OwnExcessMS == nil || math.Abs(float64(*r1.OwnExcessMS)-40.4) > 0.5 || r1.DelayMS == nil || *r1.DelayMS != *r1.OwnExcessMS {
			t.Errorf("rank 1 own excess %v delay %v; want 40.4 ms", r1.OwnExcessMS, r1.DelayMS)
		}
		if r0.Straggler || r0.OwnCause != "" || r0.HiddenWaitMS == nil || math.Abs(float64(*r0.HiddenWaitMS)-40.4) > 0.5 {
			t.Errorf("rank 0: straggler %v cause %q hidden wait %v; want the waiter, 40.4 ms hidden in its forward", r0.Straggler, r0.OwnCause, r0.HiddenWaitMS)
		}
		steps(61, 120, 0)
	})
	if a.Rank == nil || *a.Rank != 1 || a.Subject != "rank 1" {
		t.Fatalf("straggler alert names rank %v (%q); want rank 1", a.Rank, a.Subject)
	}
	for _, want := range []string{"rank 1 spends 40.4 ms a step more than the median rank waiting for its input (data)",
		"the other ranks wait for it: up to 40.4 ms a step inside their forward"} {
		if !strings.Contains(a.Text, want) {
			t.Errorf("alert text %q lacks %q", a.Text, want)
		}
	}
}

// The control over gloo: equal ranks, nobody named, no alert.
func TestOwnWorkControlRunIsClean(t *testing.T) {
	r := alertServer(t)
	const run = "gloo-control"
	t0 := time.Now().Add(-time.Minute)
	var lines []string
	for step := 1; step <= 60; step++ {
		jit := float64(step%3) * 0.3
		lines = append(lines, glooLine(run, 0, step, t0, 0.6+jit, 8, 5), glooLine(run, 1, step, t0, 0.6, 8+jit, 5))
	}
	lines = append(lines, stepLine(run, 0, 61, t0.Add(7*time.Second), "NaN", ""), stepLine(run, 1, 61, t0.Add(7*time.Second), "2.5", ""))
	ingestLines(t, r, lines)
	// The NaN loss opens its own alert: the run was evaluated.
	waitFor(t, "the non-finite alert", func() bool { return len(listAlerts(t, r, "run_id="+run+"&kind="+api.AlertNonFinite)) == 1 })
	waitPasses(t, r, 3)
	if got := listAlerts(t, r, "run_id="+run+"&kind="+api.AlertStraggler); len(got) != 0 {
		t.Fatalf("straggler alerts of the control: %+v", got)
	}
	code, b, _ := do(t, "GET", r.url+"/api/v1/runs/"+run+"/ranks?from_step=1", "", "")
	var rk api.RanksResponse
	if code != 200 || json.Unmarshal(b, &rk) != nil {
		t.Fatalf("GET /ranks = %d %s", code, b)
	}
	for _, s := range rk.Ranks {
		if s.Straggler || s.OwnCause != "" {
			t.Errorf("control rank %d: straggler %v cause %q", s.Rank, s.Straggler, s.OwnCause)
		}
	}
}
