package server

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/alerts"
	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/promtest"
	"github.com/deepseed/deepseed/store/storetest"
)

// alertServer serves a fresh database with the detectors evaluating every
// 100 ms.
func alertServer(t *testing.T) *running {
	t.Helper()
	cfg := testConfig()
	cfg.AlertsEvery = 100 * time.Millisecond
	r := start(t, New(cfg, storetest.NewStore(t), testLogger(t)))
	waitFor(t, "readyz", func() bool { code, _, _ := do(t, "GET", r.url+"/readyz", "", ""); return code == 200 })
	return r
}

// waitPasses waits until r's detectors have run n more passes over every
// run, the first of them begun after the call: what was stored before the
// call has then been evaluated n times over.
func waitPasses(t *testing.T, r *running, n int64) {
	t.Helper()
	var ev *alerts.Evaluator
	waitFor(t, "the detectors to start", func() bool { ev = r.srv.evaluator.Load(); return ev != nil })
	// The pass under way may have read the runs before the call.
	from := ev.Passes() + 1
	waitFor(t, fmt.Sprintf("%d passes of the detectors", n), func() bool { return ev.Passes() >= from+n })
}

func ingestLines(t *testing.T, r *running, lines []string) {
	t.Helper()
	if code, b, _ := do(t, "POST", r.url+"/api/v1/ingest", "", strings.Join(lines, "\n")+"\n"); code != 200 {
		t.Fatalf("ingest: %d %s", code, b)
	}
}

func listAlerts(t *testing.T, r *running, query string) []api.Alert {
	t.Helper()
	code, b, _ := do(t, "GET", r.url+"/api/v1/alerts?"+query, "", "")
	if code != 200 {
		t.Fatalf("GET /alerts?%s = %d %s", query, code, b)
	}
	var l api.AlertList
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatalf("GET /alerts: %v: %s", err, b)
	}
	return l.Alerts
}

// stepLine is a step record; extra is added JSON fields (",\"skipped\":true").
func stepLine(run string, rank, step int, at time.Time, loss, extra string) string {
	return fmt.Sprintf(`{"kind":"step","run_id":%q,"rank":%d,"step":%d,"time":%q,"loss":%s,"step_ms":1000,"data_ms":10%s}`,
		run, rank, step, at.UTC().Format(time.RFC3339Nano), loss, extra)
}

// lifecycle waits for exactly one open alert of kind on run, checks it
// stays single over several passes, lets more records clear it and waits
// for it to be resolved, still single.
func lifecycle(t *testing.T, r *running, run, kind string, clear func()) api.Alert {
	t.Helper()
	q := "run_id=" + run + "&kind=" + kind
	waitFor(t, kind+" alert to open", func() bool { return len(listAlerts(t, r, q+"&state=open")) > 0 })
	waitPasses(t, r, 10)
	open := listAlerts(t, r, q)
	if len(open) != 1 || open[0].State != "open" {
		t.Fatalf("after ten passes, %s alerts of %s = %+v; want one open", kind, run, open)
	}
	clear()
	waitFor(t, kind+" alert to resolve", func() bool { return len(listAlerts(t, r, q+"&state=resolved")) > 0 })
	waitPasses(t, r, 5)
	all := listAlerts(t, r, q)
	if len(all) != 1 || all[0].State != "resolved" || all[0].ResolvedAt == nil || all[0].ID != open[0].ID {
		t.Fatalf("after clearing, %s alerts of %s = %+v; want the one alert resolved", kind, run, all)
	}
	return open[0]
}

func TestAlertNonFiniteLoss(t *testing.T) {
	r := alertServer(t)
	t0 := time.Now().Add(-time.Minute)
	var lines []string
	for step := 1; step <= 37; step++ {
		for rank := range 4 {
			loss := "2.5"
			if step == 37 && rank == 2 {
				loss = "NaN"
			}
			lines = append(lines, stepLine("nan-run", rank, step, t0.Add(time.Duration(step)*time.Second), loss, ""))
		}
	}
	ingestLines(t, r, lines)
	a := lifecycle(t, r, "nan-run", api.AlertNonFinite, func() {
		// While open: the run detail counts it, /annotations and /metrics show it.
		code, b, _ := do(t, "GET", r.url+"/api/v1/runs/nan-run", "", "")
		var d api.RunDetail
		if code != 200 || json.Unmarshal(b, &d) != nil || d.OpenAlerts != 1 {
			t.Fatalf("GET /runs/nan-run = %d %s; want open_alerts 1", code, b)
		}
		code, b, _ = do(t, "GET", r.url+"/api/v1/annotations?run_id=nan-run&type=alert", "", "")
		var an api.AnnotationsResponse
		if code != 200 || json.Unmarshal(b, &an) != nil || len(an.Annotations) != 1 || an.Annotations[0].Step == nil || *an.Annotations[0].Step != 37 {
			t.Fatalf("GET /annotations?type=alert = %d %s; want one alert at step 37", code, b)
		}
		page, fams := promtest.Scrape(t, r.url+"/metrics")
		if m := promtest.Find(fams, "deepseed_alerts_open", map[string]string{"kind": api.AlertNonFinite}); m == nil || m.GetGauge().GetValue() != 1 {
			t.Fatalf("deepseed_alerts_open{kind=non_finite} = %v; want 1", m)
		}
		// No token configured, so no scrape can show which run it is
		// (TestMetricsNameRunsOnlyForATokenHolder shows it to one).
		if strings.Contains(page, "nan-run") {
			t.Fatal("/metrics without a token names the run")
		}
		var more []string
		for step := 38; step <= 60; step++ {
			for rank := range 4 {
				more = append(more, stepLine("nan-run", rank, step, t0.Add(time.Duration(step)*time.Second), "2.4", ""))
			}
		}
		ingestLines(t, r, more)
	})
	if a.Rank == nil || *a.Rank != 2 || a.Step == nil || *a.Step != 37 {
		t.Fatalf("non-finite alert names rank %v step %v; want rank 2 step 37", a.Rank, a.Step)
	}
	_, fams := promtest.Scrape(t, r.url+"/metrics")
	if m := promtest.Find(fams, "deepseed_alerts_open", map[string]string{"kind": api.AlertNonFinite}); m == nil || m.GetGauge().GetValue() != 0 {
		t.Fatalf("after resolving, deepseed_alerts_open{kind=non_finite} = %v; want 0", m)
	}
}

func TestAlertOverflowStorm(t *testing.T) {
	r := alertServer(t)
	t0 := time.Now().Add(-3 * time.Minute)
	var lines []string
	for step := 1; step <= 50; step++ {
		extra := ""
		if step%5 < 3 { // 30 of 50
			extra = `,"skipped":true,"loss_scale":1024`
		}
		lines = append(lines, stepLine("storm-run", 0, step, t0.Add(time.Duration(step)*time.Second), "3", extra))
	}
	ingestLines(t, r, lines)
	a := lifecycle(t, r, "storm-run", api.AlertOverflowStorm, func() {
		var more []string
		for step := 51; step <= 100; step++ {
			more = append(more, stepLine("storm-run", 0, step, t0.Add(time.Duration(step)*time.Second), "3", `,"loss_scale":1024`))
		}
		ingestLines(t, r, more)
	})
	if a.Value == nil || float64(*a.Value) != 60 || a.Threshold == nil || float64(*a.Threshold) != 20 {
		t.Fatalf("overflow alert value %v threshold %v; want 60 and 20", a.Value, a.Threshold)
	}
}

func TestAlertIdleGPU(t *testing.T) {
	r := alertServer(t)
	now := time.Now()
	t0 := now.Add(-3 * time.Minute)
	lines := []string{stepLine("idle-run", 0, 1, now, "3", "")}
	gpu := func(at time.Time, util int) string {
		return fmt.Sprintf(`{"kind":"gpu","time":%q,"host":"node1","gpu":3,"run_id":"idle-run","rank":0,"util_pct":%d}`,
			at.UTC().Format(time.RFC3339Nano), util)
	}
	for s := 0; s <= 180; s++ {
		lines = append(lines, gpu(t0.Add(time.Duration(s)*time.Second), 2))
	}
	ingestLines(t, r, lines)
	a := lifecycle(t, r, "idle-run", api.AlertIdleGPU, func() {
		ingestLines(t, r, []string{gpu(now.Add(time.Second), 95), gpu(now.Add(2*time.Second), 97)})
	})
	if a.Subject != "node1/gpu 3" || a.Rank == nil || *a.Rank != 0 {
		t.Fatalf("idle alert subject %q rank %v; want node1/gpu 3 on rank 0", a.Subject, a.Rank)
	}
}

func TestAlertStalledRun(t *testing.T) {
	r := alertServer(t)
	t0 := time.Now().Add(-10 * time.Minute)
	var lines []string
	for step := 1; step <= 60; step++ {
		lines = append(lines, stepLine("stall-run", 0, step, t0.Add(time.Duration(step)*time.Second), "3", ""))
	}
	ingestLines(t, r, lines)
	a := lifecycle(t, r, "stall-run", api.AlertStalled, func() {
		ingestLines(t, r, []string{stepLine("stall-run", 0, 61, time.Now(), "3", "")})
	})
	if a.Threshold == nil || float64(*a.Threshold) != 300 {
		t.Fatalf("stall threshold %v; want 300 s (5 minutes over 10 × 1 s steps)", a.Threshold)
	}
	// A healthy run beside it opened nothing.
	if got := listAlerts(t, r, "state=open"); len(got) != 0 {
		t.Fatalf("open alerts after resumption: %+v", got)
	}
}

func TestAlertsBadParameters(t *testing.T) {
	r := alertServer(t)
	for _, q := range []string{"state=bogus", "kind=bogus", "limit=0", "limit=x", "run_id=" + strings.Repeat("x", api.MaxIDLen+1)} {
		code, b, _ := do(t, "GET", r.url+"/api/v1/alerts?"+q, "", "")
		if code != 400 {
			t.Errorf("GET /alerts?%s = %d %s; want 400", q, code, b)
		}
		wantJSONError(t, b)
	}
}
