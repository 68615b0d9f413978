// Package exposition writes /metrics pages in the Prometheus text format
// (version 0.0.4) over github.com/VictoriaMetrics/metrics: the library
// holds the counters, gauges and `le` histograms, and this package puts
// every family under its own # HELP and # TYPE lines, which the library
// writes without a help text.
//
// Usage:
//  1. r := exposition.NewRegistry(); c := r.Counter("x_total", "What x counts.")
//     — or CounterVec, Histogram, HistogramVec, Func for values read at
//     each scrape, Writer for code that writes whole families.
//  2. c.Inc(); r.Write(w) on each scrape, or r.Handler().
//
// Families are written in the order they were added; one without a
// series is left out.
package exposition

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/VictoriaMetrics/metrics"
)

// ContentType is the media type of the pages this package writes.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Header writes a family's # HELP and # TYPE lines.
func Header(w io.Writer, name, help, typ string) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

// Sample writes one series of a gauge (or of a counter whose value is
// read rather than counted): name{labels} value, labels already joined
// (see Labels); empty labels write the bare name.
func Sample(w io.Writer, name, labels string, v float64) {
	if labels != "" {
		name += "{" + labels + "}"
	}
	metrics.WriteGaugeFloat64(w, name, v)
}

// Quote quotes a label value as the text format escapes it.
func Quote(s string) string { return `"` + labelEscaper.Replace(s) + `"` }

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// Labels joins label names and values, sorted by name as Prometheus'
// own client writes them: a="x",b="y".
func Labels(names []string, values []string) string {
	order := make([]int, len(names))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(names[a], names[b]) })
	var b strings.Builder
	for k, i := range order {
		if k > 0 {
			b.WriteByte(',')
		}
		b.WriteString(names[i])
		b.WriteByte('=')
		b.WriteString(Quote(values[i]))
	}
	return b.String()
}

// family is one family of a Registry: its series in a Set of its own, or
// written by write.
type family struct {
	name, help, typ string
	set             *metrics.Set
	write           func(w io.Writer) error
}

// Registry is the families of one /metrics page.
type Registry struct {
	mu   sync.Mutex
	fams []*family
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{} }

func (r *Registry) add(f *family) *family {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fams = append(r.fams, f)
	return f
}

func (r *Registry) set(name, help, typ string) *metrics.Set {
	return r.add(&family{name: name, help: help, typ: typ, set: metrics.NewSet()}).set
}

// Counter adds a counter without labels.
func (r *Registry) Counter(name, help string) *metrics.Counter {
	return r.set(name, help, "counter").NewCounter(name)
}

// FloatCounter adds a counter without labels that grows by fractions.
func (r *Registry) FloatCounter(name, help string) *metrics.FloatCounter {
	return r.set(name, help, "counter").NewFloatCounter(name)
}

// Histogram adds a Prometheus histogram (cumulative `le` buckets with
// the given upper bounds, +Inf, _sum and _count) without labels.
func (r *Registry) Histogram(name, help string, buckets []float64) *metrics.PrometheusHistogram {
	return r.set(name, help, "histogram").NewPrometheusHistogramExt(name, buckets)
}

// CounterVec is a counter family with labels.
type CounterVec struct {
	set    *metrics.Set
	name   string
	labels []string
}

// CounterVec adds a counter family with the given label names.
func (r *Registry) CounterVec(name, help string, labels ...string) *CounterVec {
	return &CounterVec{set: r.set(name, help, "counter"), name: name, labels: labels}
}

// With returns the counter of the given label values, in the order of
// the label names, creating it at 0.
func (v *CounterVec) With(values ...string) *metrics.Counter {
	return v.set.GetOrCreateCounter(v.name + "{" + Labels(v.labels, values) + "}")
}

// HistogramVec is a histogram family with labels.
type HistogramVec struct {
	set     *metrics.Set
	name    string
	labels  []string
	buckets []float64
}

// HistogramVec adds a Prometheus histogram family with the given upper
// bounds and label names.
func (r *Registry) HistogramVec(name, help string, buckets []float64, labels ...string) *HistogramVec {
	return &HistogramVec{set: r.set(name, help, "histogram"), name: name, labels: labels, buckets: buckets}
}

// With returns the histogram of the given label values.
func (v *HistogramVec) With(values ...string) *metrics.PrometheusHistogram {
	return v.set.GetOrCreatePrometheusHistogramExt(v.name+"{"+Labels(v.labels, values)+"}", v.buckets)
}

// Func adds a family of one series without labels whose value is read at
// each scrape; ok false leaves it out of that scrape. typ is gauge or
// counter.
func (r *Registry) Func(name, help, typ string, read func() (v float64, ok bool)) {
	r.add(&family{name: name, help: help, typ: typ, write: func(w io.Writer) error {
		if v, ok := read(); ok {
			Sample(w, name, "", v)
		}
		return nil
	}})
}

// Writer adds code that writes whole families, headers included (see
// Header and Sample), at each scrape. An error it returns is the
// scrape's (Write's); what it wrote stays.
func (r *Registry) Writer(write func(w io.Writer) error) {
	r.add(&family{write: write})
}

// Write writes every family, in the order they were added. It returns
// the first error a Writer returned; the others are written all the same.
func (r *Registry) Write(w io.Writer) error {
	r.mu.Lock()
	fams := append([]*family(nil), r.fams...)
	r.mu.Unlock()
	var first error
	var buf bytes.Buffer
	for _, f := range fams {
		buf.Reset()
		var err error
		if f.set != nil {
			f.set.WritePrometheus(&buf)
		} else {
			err = f.write(&buf)
		}
		if err != nil && first == nil {
			first = err
		}
		if buf.Len() == 0 {
			continue
		}
		if f.name != "" {
			Header(w, f.name, f.help, f.typ)
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return fmt.Errorf("exposition: write: %w", err)
		}
	}
	return first
}

// Handler answers GET and HEAD with the registries' families, in order;
// onErr hears a family's error (the page is answered without it).
func Handler(onErr func(error), regs ...*Registry) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed: use GET", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", ContentType)
		if req.Method == http.MethodHead {
			return
		}
		var page bytes.Buffer
		for _, r := range regs {
			if err := r.Write(&page); err != nil && onErr != nil {
				onErr(err)
			}
		}
		_, _ = w.Write(page.Bytes())
	})
}
