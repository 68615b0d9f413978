package server

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

func getLedger(t *testing.T, r *running, path string) []byte {
	t.Helper()
	code, b, _ := do(t, "GET", r.url+"/api/v1"+path, "", "")
	if code != 200 {
		t.Fatalf("GET %s = %d %s", path, code, b)
	}
	return b
}

// The ledger of the planted corpus: each cause lands in its own line,
// and no run's lines sum past its GPU-hours, nor the project's.
func TestLedgerCorpus(t *testing.T) {
	r := alertServer(t)
	t0 := time.Now().Add(-3 * time.Hour).Truncate(time.Second)
	none := plant{slowLayer: -1, torch: "2.3.0", throttleGPU: -1, dataRank: -1}
	runs := []struct {
		id string
		p  plant
	}{
		{"base-1", none}, {"base-2", withNoise(none, 0.004)}, {"base-3", withNoise(none, -0.003)},
		{"throttled", plant{slowLayer: -1, torch: "2.3.0", throttleGPU: 1, dataRank: -1}},
		{"data-straggler", plant{slowLayer: -1, torch: "2.3.0", throttleGPU: -1, dataRank: 2}},
		{"restarted", plant{slowLayer: -1, torch: "2.3.0", throttleGPU: -1, dataRank: -1, resumeAt: 150}},
	}
	for i, run := range runs {
		ingestLines(t, r, corpusRun(run.id, t0.Add(time.Duration(i)*20*time.Minute), run.p, i))
	}
	ledgers := map[string]api.Ledger{}
	for _, run := range runs {
		var l api.Ledger
		if err := json.Unmarshal(getLedger(t, r, "/runs/"+run.id+"/ledger"), &l); err != nil {
			t.Fatal(err)
		}
		sum := 0.0
		for _, it := range l.Items {
			if it.GPUH < 0 || it.How == "" {
				t.Errorf("%s: item %+v", run.id, it)
			}
			sum += float64(it.GPUH)
		}
		if sum > float64(l.GPUHours)+1e-12 || math.Abs(sum-float64(l.LostGPUH)) > 1e-9 || l.GPUHours <= 0 {
			t.Errorf("%s: lost %g (items %g) of %g GPU-hours", run.id, l.LostGPUH, sum, l.GPUHours)
		}
		t.Logf("%s: %.4f GPU-h, lost %.4f: %v", run.id, l.GPUHours, l.LostGPUH, l.Items)
		ledgers[run.id] = l
	}
	item := func(run, cause string) float64 {
		for _, it := range ledgers[run].Items {
			if it.Cause == cause {
				return float64(it.GPUH)
			}
		}
		t.Fatalf("%s: no %s line", run, cause)
		return 0
	}
	if item("throttled", api.LostThrottling) <= 0 {
		t.Errorf("throttled: no GPU-hours lost to throttling")
	}
	if item("data-straggler", api.LostStragglerData) <= 0 || item("data-straggler", api.LostStragglerGPU) > 0 {
		t.Errorf("data-straggler: data %g, gpu %g", item("data-straggler", api.LostStragglerData), item("data-straggler", api.LostStragglerGPU))
	}
	// Ten minutes down on four ranks, about a step less.
	if got, want := item("restarted", api.LostRestarts), 4*restartDown.Hours(); math.Abs(got-want) > 4*0.2/3600 {
		t.Errorf("restarted: restarts %g GPU-h, want about %g", got, want)
	}
	if s := item("restarted", api.LostStalled); s > 1e-6 { // the stall subtracts the median step, the restart the mean
		t.Errorf("restarted: the restart counted again as a stall: %g", s)
	}
	for _, id := range []string{"base-2", "base-3"} {
		if v := item(id, api.LostRegression) + item(id, api.LostThrottling) + item(id, api.LostStragglerData); v > 0 {
			t.Errorf("%s (control): %g GPU-h lost to planted causes", id, v)
		}
	}

	var p api.ProjectLedger
	if err := json.Unmarshal(getLedger(t, r, "/ledger?project=corpus"), &p); err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, v := range p.ByCause {
		sum += float64(v)
	}
	if len(p.Runs) != len(runs) || sum > float64(p.GPUHours)+1e-12 || math.Abs(sum-float64(p.LostGPUH)) > 1e-9 || len(p.Days) == 0 {
		t.Errorf("project ledger: %d runs, lost %g (by cause %g) of %g, %d days", len(p.Runs), p.LostGPUH, sum, p.GPUHours, len(p.Days))
	}
	for q, param := range map[string]string{"/ledger?project=corpus&limit=0": "limit", "/ledger?project=corpus&limit=x": "limit"} {
		code, b, _ := do(t, "GET", r.url+"/api/v1"+q, "", "")
		if e := wantJSONError(t, b); code != 400 || e.Param != param {
			t.Errorf("%s: %d %s", q, code, b)
		}
	}
	if code, _, _ := do(t, "GET", r.url+"/api/v1/runs/missing/ledger", "", ""); code != 404 {
		t.Errorf("unknown run: %d", code)
	}
}
