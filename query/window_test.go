package query_test

import (
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// TestSeriesTimeWindow checks what a user sees when zooming into a long
// run in Grafana: the series answers only the steps whose time is in the
// window, in finer buckets than the whole run gets, and a one-step spike
// in the window still shows.
func TestSeriesTimeWindow(t *testing.T) {
	e := newEnv(t)
	const n = 100000 // one step a second (stepRec): about 28 hours
	recs := []api.Record{runRec("w1", nil)}
	for i := int64(0); i < n; i++ {
		loss := 2.0 - float64(i)/n
		if i == 61234 {
			loss = 500
		}
		recs = append(recs, stepRec("w1", 0, i, func(s *api.Step) { s.Loss = api.F(loss) }))
	}
	e.write(recs...)
	at := func(step int64) time.Time { return t0.Add(time.Duration(step) * time.Second) }

	get := func(q url.Values) api.Series {
		t.Helper()
		q.Set("metric", "loss")
		q.Set("max_points", "100")
		var res api.SeriesResponse
		e.get("/runs/w1/series?"+q.Encode(), 200, &res)
		if len(res.Series) != 1 {
			t.Fatalf("%s: %d series", q.Encode(), len(res.Series))
		}
		return res.Series[0]
	}
	whole := get(url.Values{})

	for _, tc := range []struct {
		name     string
		from, to string
		lo, hi   int64 // the steps the window holds
	}{
		{"RFC 3339", at(60000).Format(time.RFC3339), at(62999).Format(time.RFC3339), 60000, 62999},
		{"epoch ms", strconv.FormatInt(at(60000).UnixMilli(), 10), strconv.FormatInt(at(62999).UnixMilli(), 10), 60000, 62999},
		// Between steps: the first step at or after from, the last at or before to.
		{"between steps", at(60000).Add(-500 * time.Millisecond).Format(time.RFC3339Nano), at(62999).Add(500 * time.Millisecond).Format(time.RFC3339Nano), 60000, 62999},
		// Wide enough for buckets of whole rollups, with raw rows at the edges.
		{"rollups", at(40050).Format(time.RFC3339), at(69949).Format(time.RFC3339), 40050, 69949},
		{"open end", at(99990).Format(time.RFC3339), "", 99990, n - 1},
		{"open start", "", at(9).Format(time.RFC3339), 0, 9},
		{"past the run", at(2 * n).Format(time.RFC3339), at(3 * n).Format(time.RFC3339), 1, 0},
		{"before the run", t0.Add(-time.Hour).Format(time.RFC3339), t0.Add(-time.Minute).Format(time.RFC3339), 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := url.Values{}
			if tc.from != "" {
				q.Set("from", tc.from)
			}
			if tc.to != "" {
				q.Set("to", tc.to)
			}
			s := get(q)
			if tc.lo > tc.hi {
				if len(s.Points) != 0 {
					t.Fatalf("window outside the run: %d points", len(s.Points))
				}
				return
			}
			var count int64
			var top float64
			for _, p := range s.Points {
				if p.Step < tc.lo || p.Step > tc.hi || p.Time.Before(at(tc.lo)) || p.Time.After(at(tc.hi)) {
					t.Errorf("point at step %d (%s) is outside the window [%d, %d]", p.Step, p.Time, tc.lo, tc.hi)
				}
				count += p.Count
				top = max(top, float64(p.Max))
			}
			if want := tc.hi - tc.lo + 1; count != want {
				t.Errorf("points cover %d steps, want the window's %d", count, want)
			}
			if s.BucketSteps >= whole.BucketSteps && tc.hi-tc.lo+1 < n/2 {
				t.Errorf("bucket of %d steps, no finer than the whole run's %d", s.BucketSteps, whole.BucketSteps)
			}
			if tc.lo <= 61234 && 61234 <= tc.hi && top != 500 {
				t.Errorf("the spike at step 61234 is lost: max %v", top)
			}
		})
	}

	// from_step/to_step still narrow a time window further.
	q := url.Values{"from": {at(60000).Format(time.RFC3339)}, "to": {at(62999).Format(time.RFC3339)},
		"from_step": {"62000"}, "to_step": {"70000"}}
	s := get(q)
	if len(s.Points) == 0 || s.Points[0].Step != 62000 || s.Points[len(s.Points)-1].Step > 62999 {
		t.Errorf("steps 62000..70000 within the window: %d points, first %+v", len(s.Points), s.Points[0])
	}

	var ae api.Error
	e.get("/runs/w1/series?from=2026-03-02T00:00:00Z&to=2026-03-01T00:00:00Z", 400, &ae)
	if ae.Param != "to" {
		t.Errorf("to before from: %+v", ae)
	}
	e.get("/runs/w1/series?from=yesterday", 400, &ae)
	if ae.Param != "from" {
		t.Errorf("bad from: %+v", ae)
	}
}
