package exposition_test

import (
	"bytes"
	"errors"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/internal/exposition"
	"github.com/deepseed/deepseed/internal/promtest"
)

// A page of every kind of family reads back through Prometheus' own
// parser with the values put in: counters, labelled counters with
// escaped values, `le` histograms histogram_quantile accepts, values
// read at the scrape, and the Go runtime's and process's families.
func TestPageIsPrometheusText(t *testing.T) {
	r := exposition.NewRegistry()
	c := r.Counter("t_events_total", "Events.")
	vec := r.CounterVec("t_requests_total", "Requests.", "route", "code")
	h := r.Histogram("t_write_seconds", "Writes.", []float64{0.01, 0.1, 1})
	hv := r.HistogramVec("t_request_seconds", "Requests by route.", []float64{0.01, 0.1, 1}, "route")
	r.Func("t_up", "Up.", "gauge", func() (float64, bool) { return 1, true })
	r.Func("t_absent", "Never there.", "gauge", func() (float64, bool) { return 0, false })
	r.Counter("t_unused_total", "A counter at 0 is shown.")
	r.HistogramVec("t_empty_seconds", "A histogram family without series is left out.", []float64{1})
	failed := errors.New("database away")
	r.Writer(func(w io.Writer) error {
		exposition.Header(w, "t_open", "Open things.", "gauge")
		exposition.Sample(w, "t_open", exposition.Labels([]string{"kind"}, []string{"a"}), 2)
		return failed
	})
	r.Writer(exposition.WriteProcess)

	c.Add(3)
	vec.With(`/a "b"`+"\n", "200").Inc()
	vec.With("/c", "404").Add(2)
	for _, v := range []float64{0.005, 0.05, 0.05, 0.5, 5} {
		h.Update(v)
		hv.With("/x").Update(v)
	}
	var page bytes.Buffer
	if err := r.Write(&page); !errors.Is(err, failed) {
		t.Errorf("Write = %v, want the writer's error", err)
	}
	fams := promtest.Parse(t, page.String())
	if got := promtest.Find(fams, "t_events_total", nil).GetCounter().GetValue(); got != 3 {
		t.Errorf("t_events_total = %v", got)
	}
	if m := promtest.Find(fams, "t_requests_total", map[string]string{"route": `/a "b"` + "\n", "code": "200"}); m == nil || m.GetCounter().GetValue() != 1 {
		t.Errorf("escaped label: %v\n%s", m, page.String())
	}
	if m := promtest.Find(fams, "t_requests_total", map[string]string{"route": "/c"}); m == nil || m.GetCounter().GetValue() != 2 {
		t.Errorf("t_requests_total{route=/c} = %v", m)
	}
	for _, name := range []string{"t_write_seconds", "t_request_seconds"} {
		hist := promtest.Find(fams, name, nil).GetHistogram()
		if hist.GetSampleCount() != 5 || math.Abs(hist.GetSampleSum()-5.605) > 1e-9 {
			t.Errorf("%s: count %d sum %v", name, hist.GetSampleCount(), hist.GetSampleSum())
		}
		// Three of five at or under 0.1: the median is in (0.01, 0.1].
		if q := promtest.Quantile(0.5, hist); q <= 0.01 || q > 0.1 {
			t.Errorf("%s: median %v", name, q)
		}
	}
	if promtest.Find(fams, "t_up", nil).GetGauge().GetValue() != 1 || fams["t_absent"] != nil || fams["t_empty_seconds"] != nil {
		t.Errorf("read families: up %v, absent %v, empty %v", fams["t_up"], fams["t_absent"], fams["t_empty_seconds"])
	}
	if fams["t_unused_total"] == nil || promtest.Find(fams, "t_open", map[string]string{"kind": "a"}) == nil {
		t.Errorf("a counter at 0 or a writer's family is missing:\n%s", page.String())
	}
	for name, typ := range map[string]string{"go_goroutines": "GAUGE", "process_resident_memory_bytes": "GAUGE",
		"process_cpu_seconds_total": "COUNTER", "go_gc_duration_seconds": "SUMMARY", "process_open_fds": "GAUGE", "go_info": "GAUGE"} {
		if fams[name] == nil || fams[name].GetType().String() != typ {
			t.Errorf("%s: %v, want a %s", name, fams[name].GetType(), typ)
		}
	}
	if strings.Contains(page.String(), "vmrange") {
		t.Error("the page has vmrange buckets")
	}
}

// The Go families name no path of the machine the binary was built on.
func TestProcessNamesNoBuildPath(t *testing.T) {
	var b bytes.Buffer
	if err := exposition.WriteProcess(&b); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "GOROOT") {
		t.Errorf("the page names GOROOT:\n%s", b.String())
	}
}

// Labels come out sorted by name, whatever order a family names them in.
func TestLabelsSorted(t *testing.T) {
	got := exposition.Labels([]string{"route", "method", "code"}, []string{"/x", "GET", "200"})
	if want := `code="200",method="GET",route="/x"`; got != want {
		t.Errorf("Labels = %s, want %s", got, want)
	}
}
