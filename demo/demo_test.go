package demo_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/demo"
	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/internal/fleettest"
	"github.com/deepseed/deepseed/query"
	"github.com/deepseed/deepseed/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

// roundsTo reports whether got, rounded as the report printed want (to
// want's decimals), equals want.
func roundsTo(got float64, want float64, decimals int) bool {
	k := math.Pow(10, float64(decimals))
	return math.Abs(math.Round(got*k)/k-want) < 0.5/k
}

func decimals(v float64) int {
	s := fmt.Sprintf("%v", v)
	if i := strings.IndexByte(s, '.'); i >= 0 {
		return len(s) - i - 1
	}
	return 0
}

func get(t *testing.T, url string, out any) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		var b bytes.Buffer
		_, _ = b.ReadFrom(res.Body)
		t.Fatalf("GET %s: %d %s", url, res.StatusCode, b.String())
	}
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
}

// The demo, loaded through the real ingest API, reproduces the report's
// tables through /compare, and loading it again stores nothing new.
func TestDemoReproducesReportTables(t *testing.T) {
	s := storetest.NewStore(t)
	e := echo.New()
	g := e.Group("/api/v1")
	ingest.New(s, ingest.Options{}).Register(g)
	query.New(s, query.Options{}).Register(g)
	// The first batch is refused once with 503: the loader must retry it.
	var refused atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && refused.CompareAndSwap(false, true) {
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":"database unavailable"}`, http.StatusServiceUnavailable)
			return
		}
		e.ServeHTTP(w, r)
	}))
	defer srv.Close()

	ctx := context.Background()
	var progress bytes.Buffer
	anchor := time.Date(2026, 5, 4, 12, 30, 0, 0, time.UTC)
	runs := fleettest.DemoRuns(anchor)
	res, err := demo.Load(ctx, demo.Options{Server: srv.URL, Progress: &progress, Anchor: anchor})
	if err != nil {
		t.Fatalf("load: %v\n%s", err, progress.String())
	}
	if res.Runs != len(runs) || res.Accepted == 0 || !strings.Contains(progress.String(), "retrying") {
		t.Fatalf("load: %+v\n%s", res, progress.String())
	}
	// Written to a log rather than a terminal, the progress is a line a
	// run, with no line redrawn in place.
	if strings.Contains(progress.String(), "\r") {
		t.Errorf("progress to a log redraws its lines:\n%q", progress.String())
	}
	for _, r := range runs {
		if !regexp.MustCompile(`(?m)^demo: run \d+/\d+ ` + regexp.QuoteMeta(r.ID) + ` +\d+ records$`).MatchString(progress.String()) {
			t.Errorf("no progress line for run %s:\n%s", r.ID, progress.String())
		}
	}

	for _, tb := range fleettest.DemoTables() {
		var cmp api.CompareResponse
		get(t, srv.URL+"/api/v1/compare?sweep="+tb.Sweep, &cmp)
		if len(cmp.Rows) != len(tb.Rows) {
			t.Fatalf("table %d: %d rows, want %d", tb.Number, len(cmp.Rows), len(tb.Rows))
		}
		for i, want := range tb.Rows {
			row := cmp.Rows[i]
			if row.RunID != want.RunID {
				t.Fatalf("table %d row %d: run %s, want %s", tb.Number, i, row.RunID, want.RunID)
			}
			for _, f := range []struct {
				name string
				got  *api.Float
				want float64
			}{
				{"gpu_mem_mean_mb", row.GPUMemMeanMB, want.GPUMemMB},
				{"gpu_util_pct", row.GPUUtilPct, want.GPUUtilPct},
				{"cpu_util_pct", row.CPUUtilPct, want.CPUUtilPct},
				{"step_time_s", row.StepTimeS, want.StepTimeS},
				{"steps_per_s", row.StepsPerS, want.StepsPerSec},
			} {
				if tb.Number == 10 && f.name == "steps_per_s" {
					continue // the report gives an estimated time instead
				}
				if f.got == nil || !roundsTo(float64(*f.got), f.want, decimals(f.want)) {
					t.Errorf("table %d %s %s = %v, want %v", tb.Number, want.Label, f.name, ptrStr(f.got), f.want)
				}
			}
		}
	}

	// Two peaks, one per source: the allocator's (the steps' peak, 1.5 %
	// above their steady mean in the simulation) and NVML's (the GPU
	// samples, 1 % above it, more than the steps' own device reading).
	for _, tb := range fleettest.DemoTables() {
		for _, row := range tb.Rows {
			var mem api.MemoryResponse
			get(t, srv.URL+"/api/v1/runs/"+row.RunID+"/memory", &mem)
			if mem.AllocPeakGPUBytes == nil || math.Abs(float64(*mem.AllocPeakGPUBytes)/(row.GPUMemMB*1.015e6)-1) > 1e-6 {
				t.Errorf("%s: allocator's peak GPU memory %v, want the steps' %v", row.RunID, ptrStr(mem.AllocPeakGPUBytes), row.GPUMemMB*1.015e6)
			}
			if mem.PeakGPUBytes == nil || math.Abs(float64(*mem.PeakGPUBytes)/(row.GPUMemMB*1.01e6)-1) > 1e-6 {
				t.Errorf("%s: NVML's peak GPU memory %v, want the samples' %v", row.RunID, ptrStr(mem.PeakGPUBytes), row.GPUMemMB*1.01e6)
			}
		}
	}

	// The GPU-nodes dashboard's default range, the last six hours, shows
	// both training nodes right after a load: every chart of the T4 node,
	// and the NVLink and GPM counters of the H100 node.
	q := url.Values{"from": {anchor.Add(-6 * time.Hour).Format(time.RFC3339)}, "to": {anchor.Format(time.RFC3339)},
		"metric": {"util_pct", "pcie_tx_bytes_per_s", "throttle_reasons", "ecc_corrected_total", "xid_total",
			"nvlink_tx_bytes_per_s", "sm_active_pct", "tensor_active_pct"}}
	var gpus api.GPUResponse
	get(t, srv.URL+"/api/v1/gpus?"+q.Encode(), &gpus)
	seen := map[string]bool{}
	reasons := map[float64]bool{}
	for _, sr := range gpus.Series {
		if len(sr.Points) == 0 {
			continue
		}
		seen[sr.Host+" "+sr.Metric] = true
		for _, p := range sr.Points {
			if sr.Metric == "throttle_reasons" {
				reasons[float64(p.Value)] = true
			}
			if (sr.Metric == "xid_total" && p.Max != 0) || (sr.Metric == "ecc_corrected_total" && p.Max > 1) {
				t.Errorf("%s gpu %d: %s %v on a healthy demo node", sr.Host, sr.GPU, sr.Metric, p.Max)
			}
		}
	}
	for _, want := range []string{"t4x2-node util_pct", "t4x2-node pcie_tx_bytes_per_s", "t4x2-node throttle_reasons",
		"t4x2-node ecc_corrected_total", "h100-node nvlink_tx_bytes_per_s", "h100-node sm_active_pct",
		"h100-node tensor_active_pct", "h100-node throttle_reasons"} {
		if !seen[want] {
			t.Errorf("last six hours: no %s samples (have %v)", want, seen)
		}
	}
	if seen["t4x2-node nvlink_tx_bytes_per_s"] || seen["t4x2-node sm_active_pct"] {
		t.Errorf("the T4 node reports Hopper-only counters: %v", seen)
	}
	// NVML clocks-event reasons over the whole timeline: idle between
	// runs, the T4s' power cap at full load.
	q = url.Values{"from": {fleettest.DemoEpoch(anchor).Format(time.RFC3339)}, "to": {anchor.Format(time.RFC3339)},
		"metric": {"throttle_reasons"}, "host": {"t4x2-node"}, "max_points": {"10000"}}
	get(t, srv.URL+"/api/v1/gpus?"+q.Encode(), &gpus)
	for _, sr := range gpus.Series {
		for _, p := range sr.Points {
			reasons[float64(p.Value)] = true
		}
	}
	if !reasons[1] || !reasons[4] {
		t.Errorf("throttle reasons seen: %v, want idle (1) and SW power cap (4)", reasons)
	}

	var list api.RunList
	get(t, srv.URL+"/api/v1/runs?tag=simulated&limit=100", &list)
	if list.Total != len(runs) {
		t.Fatalf("simulated runs: %d", list.Total)
	}
	var bert api.RunDetail
	get(t, srv.URL+"/api/v1/runs/demo-bert-large-zero2-fp16-offload", &bert)
	if bert.Steps != 461 || bert.SkippedSteps != 4 || bert.BestValAccuracy == nil || *bert.BestValAccuracy < 0.92 ||
		*bert.BestValAccuracy > 0.94 || bert.ZeroStage == nil || *bert.ZeroStage != 2 || bert.OffloadOptim != "cpu" {
		t.Errorf("bert run: %+v", bert.RunSummary)
	}
	var hm api.Heatmap
	get(t, srv.URL+"/api/v1/runs/demo-bert-large-zero2-fp16-offload/heatmap", &hm)
	if len(hm.Layers) != 26 || hm.Layers[0] != "embeddings" || hm.Layers[25] != "classifier" {
		t.Errorf("bert heatmap layers: %v", hm.Layers)
	}
	var bd api.Breakdown
	get(t, srv.URL+"/api/v1/runs/demo-bert-large-zero2-fp16-offload/breakdown", &bd)
	ms := map[string]float64{}
	for _, p := range bd.Parts {
		ms[p.Name] = float64(p.MS)
	}
	// Per optimizer step: 4 micro-batches of ~48 ms forward and ~92 ms backward.
	if math.Abs(ms["forward"]/4-48) > 2 || math.Abs(ms["backward"]/4-92) > 3 || math.Abs(ms["optimizer"]-28) > 2 {
		t.Errorf("bert breakdown: %+v", bd)
	}
	var an api.AnnotationsResponse
	get(t, srv.URL+"/api/v1/annotations?run_id=demo-bert-large-zero2-fp16-offload", &an)
	kinds := map[string]int{}
	for _, a := range an.Annotations {
		kinds[a.Type]++
	}
	if kinds["overflow"] != 4 || kinds["checkpoint"] != 2 || kinds["eval"] != 11 {
		t.Errorf("bert annotations: %v", kinds)
	}

	// The timeline ends at the anchor's hour, so a recent time range shows it.
	if bert.StartedAt == nil || !bert.StartedAt.Equal(fleettest.DemoEpoch(anchor)) || !fleettest.DemoEpoch(anchor).Equal(time.Date(2026, 5, 2, 12, 0, 0, 0, time.UTC)) {
		t.Errorf("bert run starts at %v, want %v", bert.StartedAt, fleettest.DemoEpoch(anchor))
	}

	// Loading again, even hours later, skips the finished runs and changes nothing.
	res2, err := demo.Load(ctx, demo.Options{Server: srv.URL, Anchor: anchor.Add(5 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	var again api.RunDetail
	get(t, srv.URL+"/api/v1/runs/demo-bert-large-zero2-fp16-offload", &again)
	if again.Steps != bert.Steps || res2.Skipped != len(runs) || res2.Records != 0 || !again.StartedAt.Equal(*bert.StartedAt) {
		t.Errorf("second load: %+v; steps %d then %d", res2, bert.Steps, again.Steps)
	}

	// Within the same hour a forced reload is recognised as duplicates.
	res3, err := demo.Load(ctx, demo.Options{Server: srv.URL, Anchor: anchor.Add(10 * time.Minute), Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if res3.Duplicates < res3.Records*9/10 {
		t.Errorf("forced reload in the same hour: %+v", res3)
	}
}

func ptrStr(v *api.Float) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprint(float64(*v))
}
