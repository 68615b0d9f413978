package server

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// syncLine is a step of a synchronous run: every rank 100 ms long; the
// rank arrives late ms after the first one and every rank leaves the
// collective together 2 ms after the last arrival (lastLate ms).
func syncLine(run string, rank, step int, t0 time.Time, late, lastLate float64) string {
	base := t0.Add(time.Duration(step) * 100 * time.Millisecond)
	arrival := base.UnixNano() + int64(late*1e6)
	wait := lastLate + 2 - late
	return fmt.Sprintf(`{"kind":"step","run_id":%q,"rank":%d,"step":%d,"time":%q,"loss":2.5,"step_ms":100,"sync_ns":%d,"sync_wait_ms":%g,"input_wait_ms":1}`,
		run, rank, step, base.UTC().Format(time.RFC3339Nano), arrival, wait)
}

// Eight ranks with equal step times, rank 3 arriving 25 ms (a quarter of
// a step) late at every step: the ranks endpoint and the straggler alert
// name rank 3, the alert stays single and resolves once rank 3 is on time.
func TestAlertStragglerFromLateness(t *testing.T) {
	r := alertServer(t)
	const run = "late-run"
	t0 := time.Now().Add(-time.Minute)
	steps := func(from, to int, late3 float64) {
		var lines []string
		for step := from; step <= to; step++ {
			for rank := range 8 {
				late := 0.0
				if rank == 3 {
					late = late3
				}
				lines = append(lines, syncLine(run, rank, step, t0, late, late3))
			}
		}
		ingestLines(t, r, lines)
	}
	steps(1, 60, 25)
	a := lifecycle(t, r, run, api.AlertStraggler, func() {
		// While open: the ranks endpoint tells the same story.
		code, b, _ := do(t, "GET", r.url+"/api/v1/runs/"+run+"/ranks?steady_from=1", "", "")
		var rk api.RanksResponse
		if code != 200 || json.Unmarshal(b, &rk) != nil || len(rk.Ranks) != 8 {
			t.Fatalf("GET /ranks = %d %s", code, b)
		}
		if rk.LatenessFrom != "arrivals" {
			t.Errorf("lateness_from %q, want arrivals", rk.LatenessFrom)
		}
		for _, s := range rk.Ranks {
			if float64(s.MedianStepMS) != 100 {
				t.Errorf("rank %d median step %v; every step was 100 ms", s.Rank, s.MedianStepMS)
			}
			wantLate, wantWait, wantLast := 0.0, 27.0, 0.0
			if s.Rank == 3 {
				wantLate, wantWait, wantLast = 25, 2, 100
			}
			if s.LatenessMS == nil || math.Abs(float64(*s.LatenessMS)-wantLate) > 1e-3 ||
				s.SyncWaitMS == nil || math.Abs(float64(*s.SyncWaitMS)-wantWait) > 1e-9 ||
				s.BusyMS == nil || math.Abs(float64(*s.BusyMS)-(100-wantWait)) > 1e-9 ||
				s.LastPct == nil || float64(*s.LastPct) != wantLast || s.InputWaitMS == nil || float64(*s.InputWaitMS) != 1 {
				t.Errorf("rank %d: lateness %v wait %v busy %v last %v input %v; want %v, %v, %v, %v, 1", s.Rank,
					s.LatenessMS, s.SyncWaitMS, s.BusyMS, s.LastPct, s.InputWaitMS, wantLate, wantWait, 100-wantWait, wantLast)
			}
			if s.Straggler != (s.Rank == 3) {
				t.Errorf("rank %d straggler %v", s.Rank, s.Straggler)
			}
			if s.StragglerScore == nil || (s.Rank == 3) != (*s.StragglerScore > 0.1) {
				t.Errorf("rank %d straggler score %v", s.Rank, s.StragglerScore)
			}
		}
		steps(61, 100, 0) // rank 3 on time again
	})
	if a.Rank == nil || *a.Rank != 3 || a.Subject != "rank 3" {
		t.Fatalf("straggler alert names rank %v (%q); want rank 3", a.Rank, a.Subject)
	}
	// Score of a quarter-step lateness over the healthy ranks' 73 ms busy.
	if a.Value == nil || math.Abs(float64(*a.Value)-100*25.0/73) > 1 {
		t.Fatalf("straggler value %v %%, want about %.1f", a.Value, 100*25.0/73)
	}
	if got := listAlerts(t, r, "run_id="+run+"&state=open"); len(got) != 0 {
		t.Fatalf("open alerts once rank 3 is on time: %+v", got)
	}
}
