package alerts

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/exposition"
	"github.com/deepseed/deepseed/store"
)

// The alert families of /metrics: name and help.
var (
	openFamily    = [2]string{"deepseed_alerts_open", "Alerts open now, by kind."}
	totalFamily   = [2]string{"deepseed_alerts_opened_total", "Alerts ever opened and still stored, by kind."}
	runOpenFamily = [2]string{"deepseed_run_alerts_open", "Alerts open now, by run, kind and subject (one series per open alert)."}
)

// Collector shows the alerts table on /metrics, read at each scrape (a
// small aggregate over the alerts table): counts by kind, which name no
// run or project.
type Collector struct{ Store *store.Store }

// RunCollector shows one series per open alert, naming its run and
// project: for scrapers that hold a token (see server's /metrics).
type RunCollector struct{ Store *store.Store }

// WriteMetrics writes the counts of open and opened alerts by kind, every
// kind from the start at 0. A database that does not answer leaves the
// alert families out of this scrape, with the error returned.
func (c Collector) WriteMetrics(w io.Writer) error {
	if c.Store == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	counts, err := c.Store.AlertCounts(ctx)
	if err != nil {
		return fmt.Errorf("alerts: metrics: %w", err)
	}
	openN, totalN := map[string]float64{}, map[string]float64{}
	for _, r := range counts {
		openN[r.Kind], totalN[r.Kind] = r.Open, r.Total
	}
	for _, k := range api.AlertKinds {
		openN[k], totalN[k] = openN[k], totalN[k]
	}
	kinds := make([]string, 0, len(openN))
	for k := range openN {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, f := range []struct {
		family [2]string
		typ    string
		n      map[string]float64
	}{{openFamily, "gauge", openN}, {totalFamily, "counter", totalN}} {
		exposition.Header(w, f.family[0], f.family[1], f.typ)
		for _, k := range kinds {
			exposition.Sample(w, f.family[0], "kind="+exposition.Quote(k), f.n[k])
		}
	}
	return nil
}

// WriteMetrics writes one series per open alert (at most 1,000). A
// database that does not answer leaves the family out of this scrape,
// with the error returned.
func (c RunCollector) WriteMetrics(w io.Writer) error {
	if c.Store == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	open, err := c.Store.OpenAlerts(ctx, 1000)
	if err != nil {
		return fmt.Errorf("alerts: run metrics: %w", err)
	}
	var series []string
	for _, a := range open {
		series = append(series, exposition.Labels([]string{"run_id", "project", "kind", "subject"}, []string{a.RunID, a.Project, a.Kind, a.Subject}))
	}
	if len(series) > 0 {
		exposition.Header(w, runOpenFamily[0], runOpenFamily[1], "gauge")
		for _, s := range series {
			exposition.Sample(w, runOpenFamily[0], s, 1)
		}
	}
	return nil
}
