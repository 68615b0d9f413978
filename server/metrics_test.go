package server

import (
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	dto "github.com/prometheus/client_model/go"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/promtest"
	"github.com/deepseed/deepseed/store/storetest"
)

// TestMetricsArePrometheusNative scrapes a live server, after ingest and
// query traffic, with Prometheus' own text parser: every family has its
// # HELP and # TYPE, the histograms have cumulative le buckets up to
// +Inf, and histogram_quantile over them lands where the requests' real
// durations were.
func TestMetricsArePrometheusNative(t *testing.T) {
	srv := New(testConfig(), storetest.NewStore(t), testLogger(t))
	// A route that takes a known time puts the quantile to the test.
	const slow = 30 * time.Millisecond
	srv.echo.GET("/test-slow", func(c echo.Context) error {
		time.Sleep(slow)
		return c.NoContent(204)
	})
	r := start(t, srv)
	waitFor(t, "ready", func() bool { code, _, _ := do(t, "GET", r.url+"/readyz", "", ""); return code == 200 })

	for i := 0; i < 20; i++ {
		if code, body, _ := do(t, "GET", r.url+"/test-slow", "", ""); code != 204 {
			t.Fatalf("slow route: %d %s", code, body)
		}
		if code, body, _ := do(t, "GET", r.url+"/healthz", "", ""); code != 200 {
			t.Fatalf("healthz: %d %s", code, body)
		}
	}
	if code, body, _ := do(t, "POST", r.url+"/api/v1/ingest", "", stepRecord); code != 200 {
		t.Fatalf("ingest: %d %s", code, body)
	}
	if code, body, _ := do(t, "POST", r.url+"/api/v1/ingest", "", `{"kind":"step","run_id":"r","rank":-1,"step":1}`); code != 400 {
		t.Fatalf("bad ingest: %d %s", code, body)
	}
	if code, body, _ := do(t, "GET", r.url+"/api/v1/runs", "", ""); code != 200 {
		t.Fatalf("runs: %d %s", code, body)
	}

	page, fams := promtest.Scrape(t, r.url+"/metrics")
	if strings.Contains(page, "vmrange") {
		t.Errorf("the page still has vmrange buckets")
	}
	for name, typ := range map[string]string{
		"deepseed_http_requests_total":                "COUNTER",
		"deepseed_http_request_duration_seconds":      "HISTOGRAM",
		"deepseed_db_write_duration_seconds":          "HISTOGRAM",
		"deepseed_ingest_records_total":               "COUNTER",
		"deepseed_ingest_rejected_total":              "COUNTER",
		"deepseed_ingest_duplicates_total":            "COUNTER",
		"deepseed_ingest_combined_batches_total":      "COUNTER",
		"deepseed_ingest_combine_fallbacks_total":     "COUNTER",
		"deepseed_retention_failures_total":           "COUNTER",
		"deepseed_db_pool_total_conns":                "GAUGE",
		"deepseed_db_pool_acquire_wait_seconds_total": "COUNTER",
		"process_resident_memory_bytes":               "GAUGE",
		"go_goroutines":                               "GAUGE",
	} {
		mf := fams[name]
		if mf == nil {
			t.Errorf("no %s family", name)
			continue
		}
		if got := mf.GetType().String(); got != typ {
			t.Errorf("%s is a %s, want %s", name, got, typ)
		}
	}
	counter := func(name string, labels map[string]string) float64 {
		t.Helper()
		m := promtest.Find(fams, name, labels)
		if m == nil {
			t.Fatalf("no %s%v", name, labels)
		}
		return m.GetCounter().GetValue()
	}
	if v := counter("deepseed_ingest_records_total", map[string]string{"kind": "step"}); v != 1 {
		t.Errorf("records_total{kind=step} = %v, want 1", v)
	}
	if v := counter("deepseed_ingest_rejected_total", map[string]string{"kind": "step"}); v != 1 {
		t.Errorf("rejected_total{kind=step} = %v, want 1", v)
	}
	if v := counter("deepseed_http_requests_total", map[string]string{"route": "/test-slow", "method": "GET", "code": "204"}); v != 20 {
		t.Errorf("requests_total for the slow route = %v, want 20", v)
	}

	hist := func(route string) float64 {
		t.Helper()
		m := promtest.Find(fams, "deepseed_http_request_duration_seconds", map[string]string{"route": route})
		if m == nil {
			t.Fatalf("no duration histogram for %s", route)
		}
		h := m.GetHistogram()
		if route == "/test-slow" {
			if h.GetSampleCount() != 20 {
				t.Errorf("slow route: _count = %d, want 20", h.GetSampleCount())
			}
			if s := h.GetSampleSum(); s < 20*slow.Seconds() {
				t.Errorf("slow route: _sum = %vs, below the %vs slept", s, 20*slow.Seconds())
			}
		}
		return promtest.Quantile(0.5, h)
	}
	// Every slow request took at least 30 ms, so the median is in or above
	// the (25 ms, 50 ms] bucket; a load spike may push a few higher, never
	// half of them past a second.
	if q := hist("/test-slow"); q < 0.025 || q > 1 {
		t.Errorf("median of the slow route = %vs, want between 0.025 and 1", q)
	}
	if q := hist("/healthz"); !(q < 0.025) {
		t.Errorf("median of /healthz = %vs, want well under the slow route's", q)
	}
	write := fams["deepseed_db_write_duration_seconds"].GetMetric()[0].GetHistogram()
	if write.GetSampleCount() != 1 {
		t.Errorf("db write histogram counted %d writes, want 1", write.GetSampleCount())
	}
}

// /metrics is public: the counts of open alerts are there for anyone, the
// series that name a run and its project only for a scrape with a valid
// token.
func TestMetricsNameRunsOnlyForATokenHolder(t *testing.T) {
	cfg := testConfig()
	cfg.AlertsEvery = 100 * time.Millisecond
	cfg.IngestTokens, cfg.ReadTokens = []string{"metrics-ingest"}, []string{"metrics-read"}
	r := start(t, New(cfg, storetest.NewStore(t), testLogger(t)))
	waitFor(t, "readyz", func() bool { code, _, _ := do(t, "GET", r.url+"/readyz", "", ""); return code == 200 })

	t0 := time.Now().Add(-time.Minute)
	lines := []string{`{"kind":"run","run_id":"secret-run","project":"secret-project","name":"n"}`}
	for step := 1; step <= 5; step++ {
		loss := "2.5"
		if step == 5 {
			loss = "NaN"
		}
		lines = append(lines, stepLine("secret-run", 0, step, t0.Add(time.Duration(step)*time.Second), loss, ""))
	}
	if code, b, _ := do(t, "POST", r.url+"/api/v1/ingest", "metrics-ingest", strings.Join(lines, "\n")+"\n"); code != 200 {
		t.Fatalf("ingest: %d %s", code, b)
	}
	waitFor(t, "the alert to open", func() bool {
		code, b, _ := do(t, "GET", r.url+"/api/v1/alerts?run_id=secret-run&state=open", "metrics-read", "")
		return code == 200 && strings.Contains(string(b), api.AlertNonFinite)
	})

	scrape := func(token string) (string, map[string]*dto.MetricFamily) {
		code, b, _ := do(t, "GET", r.url+"/metrics", token, "")
		if code != 200 {
			t.Fatalf("GET /metrics with token %q: %d", token, code)
		}
		return string(b), promtest.Parse(t, string(b))
	}
	for _, token := range []string{"", "not-a-token"} {
		page, fams := scrape(token)
		if m := promtest.Find(fams, "deepseed_alerts_open", map[string]string{"kind": api.AlertNonFinite}); m == nil || m.GetGauge().GetValue() != 1 {
			t.Errorf("token %q: deepseed_alerts_open{kind=non_finite} = %v; want 1", token, m)
		}
		if strings.Contains(page, "secret-run") || strings.Contains(page, "secret-project") {
			t.Errorf("token %q: /metrics names the run or its project", token)
		}
	}
	_, fams := scrape("metrics-read")
	if m := promtest.Find(fams, "deepseed_run_alerts_open", map[string]string{"run_id": "secret-run", "project": "secret-project",
		"kind": api.AlertNonFinite}); m == nil {
		t.Error("with a read token, deepseed_run_alerts_open has no series for the run")
	}
}
