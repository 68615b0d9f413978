// Package promtest reads a /metrics page the way Prometheus does, for
// tests: it parses the text exposition format with Prometheus' own parser,
// checks what every family must carry, and computes histogram quantiles
// from the buckets as PromQL's histogram_quantile does.
package promtest

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape gets url as Prometheus would, asking for the text format, and
// returns the page and its families.
func Scrape(t testing.TB, url string) (string, map[string]*dto.MetricFamily) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: status %d: %s", url, res.StatusCode, body)
	}
	if ct := res.Header.Get("Content-Type"); expfmt.ResponseFormat(res.Header).FormatType() != expfmt.TypeTextPlain {
		t.Fatalf("scrape %s: Content-Type %q is not the Prometheus text format", url, ct)
	}
	return string(body), Parse(t, string(body))
}

// Parse parses a page in the text format with the classic (legacy) metric
// name rules, and checks every family: a # HELP with text, a # TYPE, and,
// for histograms, buckets that histogram_quantile accepts.
func Parse(t testing.TB, page string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(page))
	if err != nil {
		t.Fatalf("the Prometheus text parser refuses the page: %v\n%s", err, page)
	}
	if len(fams) == 0 {
		t.Fatalf("no metric families in the page:\n%s", page)
	}
	for name, mf := range fams {
		if mf.GetHelp() == "" {
			t.Errorf("%s has no # HELP text", name)
		}
		if mf.GetType() == dto.MetricType_UNTYPED {
			t.Errorf("%s has no # TYPE line", name)
		}
		if mf.GetType() == dto.MetricType_COUNTER && !strings.HasSuffix(name, "_total") && !strings.HasPrefix(name, "DCGM_FI_") {
			t.Errorf("counter %s does not end in _total", name)
		}
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			for _, m := range mf.GetMetric() {
				if err := checkHistogram(m.GetHistogram()); err != nil {
					t.Errorf("%s{%s}: %v", name, Labels(m), err)
				}
			}
		}
	}
	return fams
}

// checkHistogram holds a classic histogram to what histogram_quantile
// needs: bucket bounds rising to +Inf, cumulative counts that never fall,
// and the +Inf bucket equal to _count.
func checkHistogram(h *dto.Histogram) error {
	bs := h.GetBucket()
	if len(bs) < 2 {
		return fmt.Errorf("%d le buckets, want several", len(bs))
	}
	for i := 1; i < len(bs); i++ {
		if !(bs[i].GetUpperBound() > bs[i-1].GetUpperBound()) {
			return fmt.Errorf("le bounds not rising: %v after %v", bs[i].GetUpperBound(), bs[i-1].GetUpperBound())
		}
		if bs[i].GetCumulativeCount() < bs[i-1].GetCumulativeCount() {
			return fmt.Errorf("bucket counts fall: le=%v has %d, le=%v has %d", bs[i].GetUpperBound(), bs[i].GetCumulativeCount(), bs[i-1].GetUpperBound(), bs[i-1].GetCumulativeCount())
		}
	}
	last := bs[len(bs)-1]
	if !math.IsInf(last.GetUpperBound(), 1) {
		return fmt.Errorf("no le=\"+Inf\" bucket")
	}
	if last.GetCumulativeCount() != h.GetSampleCount() {
		return fmt.Errorf("le=\"+Inf\" bucket holds %d, _count is %d", last.GetCumulativeCount(), h.GetSampleCount())
	}
	if h.SampleSum == nil {
		return fmt.Errorf("no _sum")
	}
	return nil
}

// Labels writes a metric's labels as name="value" pairs, sorted.
func Labels(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// Find returns the metric of family name whose labels include every pair
// in want, or nil.
func Find(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	mf := fams[name]
	if mf == nil {
		return nil
	}
next:
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

// Quantile is PromQL's histogram_quantile(q, …) over one classic
// histogram: the bucket holding the q-th observation, and within it a
// linear interpolation between its bounds (the first bucket's lower bound
// is 0; an answer in the +Inf bucket is the highest finite bound). It is
// NaN for an empty histogram.
func Quantile(q float64, h *dto.Histogram) float64 {
	bs := h.GetBucket()
	if len(bs) == 0 || h.GetSampleCount() == 0 {
		return math.NaN()
	}
	total := float64(bs[len(bs)-1].GetCumulativeCount())
	rank := q * total
	i := sort.Search(len(bs), func(i int) bool { return float64(bs[i].GetCumulativeCount()) >= rank })
	if i == len(bs)-1 && math.IsInf(bs[i].GetUpperBound(), 1) {
		return bs[len(bs)-2].GetUpperBound()
	}
	lower, below := 0.0, 0.0
	if i > 0 {
		lower, below = bs[i-1].GetUpperBound(), float64(bs[i-1].GetCumulativeCount())
	}
	upper := bs[i].GetUpperBound()
	in := float64(bs[i].GetCumulativeCount()) - below
	if in == 0 {
		return upper
	}
	return lower + (upper-lower)*(rank-below)/in
}
