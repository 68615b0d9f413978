package server

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// A constructed run's wasted GPU-hours, each cause computed here from the
// records sent: two ranks of 1 s steps, three skipped steps, rank 0
// waiting 200 ms longer than rank 1 in every collective, a ten-minute
// stall, and GPU samples below 10 % before and during the stall (those
// during it count as stalled, not idle).
func TestWastedGPUHours(t *testing.T) {
	r := alertServer(t)
	const run = "waste-run"
	const ranks, steps, stallAfter = 2, 70, 60
	stall := 600 * time.Second
	t0 := time.Now().Add(-(steps*time.Second + stall + 30*time.Second)).Truncate(time.Second)
	at := func(step int) time.Time {
		d := time.Duration(step) * time.Second
		if step > stallAfter {
			d += stall
		}
		return t0.Add(d)
	}
	waits := [ranks]float64{300, 100}
	skipped := map[int]bool{10: true, 11: true, 12: true}
	var lines []string
	for step := 1; step <= steps; step++ {
		for rank := range ranks {
			extra := ""
			if skipped[step] {
				extra = `,"skipped":true`
			}
			lines = append(lines, fmt.Sprintf(`{"kind":"step","run_id":%q,"rank":%d,"step":%d,"time":%q,"step_ms":1000,"sync_wait_ms":%g%s}`,
				run, rank, step, at(step).UTC().Format(time.RFC3339Nano), waits[rank], extra))
		}
	}
	type sample struct {
		gpu, k int
		util   float64
	}
	var samples []sample
	for gpu := range 2 {
		for k := range 100 {
			u := 50.0
			if gpu == 0 && k < 30 || gpu == 1 && k >= 50 {
				u = 2 + float64(gpu)*3
			}
			samples = append(samples, sample{gpu, k, u})
			lines = append(lines, fmt.Sprintf(`{"kind":"gpu","time":%q,"host":"n1","gpu":%d,"run_id":%q,"rank":%d,"util_pct":%g}`,
				t0.Add(time.Duration(k)*time.Second).UTC().Format(time.RFC3339Nano), gpu, run, gpu, u))
		}
	}
	ingestLines(t, r, lines)

	// What the documented formulas give for these inputs.
	const hour = 3600e3 // ms
	var wantSkipped, wantStrag, wantStalled, wantIdle float64
	for step := 1; step <= steps; step++ {
		if skipped[step] {
			wantSkipped += ranks * 1000 / hour
		}
		lo := math.Min(waits[0], waits[1])
		for _, w := range waits {
			wantStrag += (w - lo) / hour
		}
		if step < steps {
			if gap := at(step + 1).Sub(at(step)); gap > 5*time.Minute {
				wantStalled += ranks * (float64(gap.Milliseconds()) - 1000) / hour
			}
		}
	}
	stallLo, stallHi := at(stallAfter), at(stallAfter+1)
	for _, s := range samples {
		ts := t0.Add(time.Duration(s.k) * time.Second)
		if s.util < 10 && s.k < 99 && (ts.Before(stallLo) || !ts.Before(stallHi)) {
			wantIdle += 1.0 / 3600
		}
	}
	want := api.WastedGPUHours{Idle: api.Float(wantIdle), Straggler: api.Float(wantStrag), Stalled: api.Float(wantStalled),
		Skipped: api.Float(wantSkipped), Total: api.Float(wantIdle + wantStrag + wantStalled + wantSkipped)}
	if wantIdle == 0 || wantStrag == 0 || wantStalled == 0 || wantSkipped == 0 {
		t.Fatalf("the constructed run wastes nothing of some cause: %+v", want)
	}
	near := func(a, b api.Float) bool { return math.Abs(float64(a-b)) < 1e-9 }
	same := func(got api.WastedGPUHours) bool {
		return near(got.Idle, want.Idle) && near(got.Straggler, want.Straggler) && near(got.Stalled, want.Stalled) &&
			near(got.Skipped, want.Skipped) && near(got.Total, want.Total)
	}

	code, b, _ := do(t, "GET", r.url+"/api/v1/runs/"+run, "", "")
	var d api.RunDetail
	if code != 200 || json.Unmarshal(b, &d) != nil {
		t.Fatalf("GET /runs/%s = %d %s", run, code, b)
	}
	if !same(d.Wasted) {
		t.Fatalf("run summary wasted %+v, want %+v", d.Wasted, want)
	}
	code, b, _ = do(t, "GET", r.url+"/api/v1/compare?run="+run, "", "")
	var cmp api.CompareResponse
	if code != 200 || json.Unmarshal(b, &cmp) != nil || len(cmp.Rows) != 1 {
		t.Fatalf("GET /compare = %d %s", code, b)
	}
	row := cmp.Rows[0]
	if row.Wasted == nil || !same(*row.Wasted) || row.WastedGPUH == nil || !near(*row.WastedGPUH, want.Total) {
		t.Fatalf("compare row wasted %+v (%v), want %+v", row.Wasted, row.WastedGPUH, want)
	}
}
