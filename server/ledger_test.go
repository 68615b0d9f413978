package server

import (
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
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
	for _, run := range runs {
		waitRollups(t, r, run.id)
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

// The ledger and /ranks of two real runs recorded on an H200 by the
// conformance matrix (hook/gpu_check/conformance.py): DDP over gloo, two
// ranks on one GPU, whose collectives block the host; in one of them rank
// 1's input came 40 ms late every step. Rank 0's wait then hides inside its
// forward, where no collective wait shows it: the straggler must still be
// named with its cause, its cost booked as a data straggler (not as a
// regression against the control), and the control must lose next to
// nothing.
func TestLedgerOfRealHostBlockingRuns(t *testing.T) {
	r := alertServer(t)
	f, err := os.Open(filepath.Join("testdata", "gloo_ddp_h200.ndjson.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	ingestLines(t, r, strings.Split(strings.TrimSpace(string(raw)), "\n"))

	var ranks api.RanksResponse
	code, b, _ := do(t, "GET", r.url+"/api/v1/runs/gloo-data/ranks", "", "")
	if code != 200 || json.Unmarshal(b, &ranks) != nil {
		t.Fatalf("GET /runs/gloo-data/ranks = %d %s", code, b)
	}
	var named []string
	for _, st := range ranks.Ranks {
		if st.Straggler {
			named = append(named, fmt.Sprintf("rank %d (%s, %s)", st.Rank, st.OwnCause, st.StragglerBy))
		}
	}
	if len(named) != 1 || named[0] != "rank 1 (data, own_work)" {
		t.Fatalf("stragglers named: %v, want rank 1 by its data time", named)
	}

	lost := func(run string) (api.Ledger, map[string]float64) {
		var l api.Ledger
		if err := json.Unmarshal(getLedger(t, r, "/runs/"+run+"/ledger"), &l); err != nil {
			t.Fatal(err)
		}
		by := map[string]float64{}
		sum := 0.0
		for _, it := range l.Items {
			by[it.Cause] += float64(it.GPUH)
			sum += float64(it.GPUH)
		}
		if !(float64(l.GPUHours) > 0) || sum > float64(l.GPUHours)*(1+1e-9) {
			t.Fatalf("%s: lost %.6g GPU-h of %.6g", run, sum, float64(l.GPUHours))
		}
		return l, by
	}
	l, by := lost("gloo-data")
	if share := by[api.LostStragglerData] / float64(l.GPUHours); share < 0.3 {
		t.Errorf("data straggler booked %.0f %% of the run's GPU-hours (%v), want the wait of half a step", share*100, by)
	}
	if by[api.LostRegression] > by[api.LostStragglerData]/4 {
		t.Errorf("the straggler's cost booked as a regression: %v", by)
	}
	l, by = lost("gloo-control")
	total := 0.0
	for _, v := range by {
		total += v
	}
	if total > 0.05*float64(l.GPUHours) {
		t.Errorf("the control lost %.0f %% of its GPU-hours: %v", total/float64(l.GPUHours)*100, by)
	}
}
