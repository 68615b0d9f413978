package plugin

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/deepseed/deepseed/api"
)

// A run-scoped dashboard shows one run, which lasts minutes to days, under
// a time picker that defaults to "Last 7 days". Its time panels therefore
// carry a panel time override made of two hidden variables fed by the
// window resource: timeFrom $run_span and timeShift $run_shift. Grafana
// evaluates "now-$run_span-$run_shift" to "now-$run_shift", which is the
// run's window with a margin, whatever relative range the picker shows.
// Grafana applies timeFrom only while the picker's range is relative; for
// an explicit range (a link from the runs list, a typed range) the shift
// is answered as 0s, so the panels show exactly the picker's range.

// windowMargin is the share of a run's length added on each side of its
// window, so its first and last points are not on the panel's edge.
const windowMargin = 0.02

// minWindowMargin is the least margin on each side.
const minWindowMargin = 5 * time.Second

// explicitRangeSlack is how far before now a range may end and still be
// read as relative ("Last N", ending now).
const explicitRangeSlack = time.Minute

// runWindow is a run's time window with its margin.
type runWindow struct {
	from, to time.Time
	running  bool
}

// windowOf gives run r's window at now: from its start to its end, or to
// now while it runs (or when its end is unknown).
func windowOf(r api.RunSummary, now time.Time) (runWindow, error) {
	if r.StartedAt == nil {
		return runWindow{}, &QueryError{Field: "run", Msg: fmt.Sprintf("run %s has no start time", r.RunID)}
	}
	start := *r.StartedAt
	end, running := now, true
	switch {
	case r.EndedAt != nil:
		end, running = *r.EndedAt, false
	case r.Status != "" && r.Status != "running" && r.LastSeenAt != nil:
		end, running = *r.LastSeenAt, false
	case r.LastSeenAt != nil && now.Sub(*r.LastSeenAt) > api.SilentAfter:
		// "running" with no record for long and no end record (a job
		// killed without one): the window ends at its last record, not
		// now, or its minutes would sit at the left of hours of nothing.
		end, running = *r.LastSeenAt, false
	}
	if end.Before(start) {
		end = start
	}
	margin := max(time.Duration(float64(end.Sub(start))*windowMargin), minWindowMargin)
	w := runWindow{from: start.Add(-margin), to: end.Add(margin), running: running}
	if running || w.to.After(now) {
		w.to = now
	}
	return w, nil
}

// part answers one of [api.WindowParts]. pickerTo is the end of the
// dashboard's range, zero when unknown.
func (w runWindow) part(name string, now, pickerTo time.Time) (string, error) {
	switch name {
	case "span":
		return seconds(w.to.Sub(w.from)), nil
	case "shift":
		if !pickerTo.IsZero() && pickerTo.Before(now.Add(-explicitRangeSlack)) {
			return "0s", nil
		}
		return seconds(max(now.Sub(w.to), 0)), nil
	case "from":
		return strconv.FormatInt(w.from.UnixMilli(), 10), nil
	case "to":
		return strconv.FormatInt(w.to.UnixMilli(), 10), nil
	}
	return "", &QueryError{Field: "part", Msg: fmt.Sprintf("%q: want one of %s", name, strings.Join(api.WindowParts, ", "))}
}

// seconds writes d as a Grafana relative time in whole seconds, rounded up
// so the window is never cut short.
func seconds(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	return strconv.FormatInt(s, 10) + "s"
}

// windowResource serves window?run=&part=[&to=]: one option whose value is
// the part asked for.
func (d *Datasource) windowResource(ctx context.Context, q url.Values, now time.Time) ([]Option, error) {
	run, part := q.Get("run"), q.Get("part")
	if run == "" {
		return nil, &QueryError{Field: "run", Msg: "window needs ?run="}
	}
	if !slices.Contains(api.WindowParts, part) {
		return nil, &QueryError{Field: "part", Msg: fmt.Sprintf("%q: want one of %s", part, strings.Join(api.WindowParts, ", "))}
	}
	var pickerTo time.Time
	if v := q.Get("to"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return nil, &QueryError{Field: "to", Msg: fmt.Sprintf("%q: want an RFC 3339 time", v)}
		}
		pickerTo = t
	}
	if run == api.AllValue {
		// A dashboard showing every run (GPU nodes' "All") fits its time
		// range to the newest run of the project.
		p := url.Values{"limit": {"1"}}
		if pr := q.Get("project"); pr != "" && pr != api.AllValue {
			p.Set("project", pr)
		}
		var page api.RunList
		if err := d.client.get(ctx, "/api/v1/runs", p, &page); err != nil {
			return nil, err
		}
		if len(page.Runs) == 0 {
			return nil, &QueryError{Field: "run", Msg: "no run to fit the time range to"}
		}
		run = page.Runs[0].RunID
	}
	var r api.RunDetail
	if err := d.client.get(ctx, runPath(run, ""), nil, &r); err != nil {
		return nil, err
	}
	w, err := windowOf(r.RunSummary, now)
	if err != nil {
		return nil, err
	}
	v, err := w.part(part, now, pickerTo)
	if err != nil {
		return nil, err
	}
	return []Option{{Text: v, Value: v}}, nil
}
