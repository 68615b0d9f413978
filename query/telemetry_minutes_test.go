package query_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/query"
	"github.com/deepseed/deepseed/store/storetest"
)

// daySamples are a day of 8 GPUs of host h sampled every 10 s, attributed
// to run day, with values that change from sample to sample: utilisation,
// memory, power, temperature, throttle reasons and the last XID.
func daySamples() []api.Record { return daySamplesEvery(10 * time.Second) }

// daySamplesEvery is daySamples sampled every every.
func daySamplesEvery(every time.Duration) []api.Record {
	recs := []api.Record{runRec("day", nil)}
	for i := range int(24 * time.Hour / every) {
		at := api.T(t0.Add(time.Duration(i) * every))
		for g := range 8 {
			recs = append(recs, api.Record{GPU: &api.GPU{Kind: "gpu", Time: at, Host: "h", GPU: api.Ptr(g), UUID: fmt.Sprintf("GPU-%d", g),
				Name: "H100", RunID: "day", Rank: api.Ptr(g), UtilPct: api.F(float64((i*7 + g*13) % 101)),
				MemUsedBytes: api.F(float64(1e9 + int64(i)*4096 + int64(g))), PowerW: api.F(300 + float64(i%17) + 0.25*float64(g)),
				TempC: api.F(float64(50 + (i/60)%20)), ThrottleReasons: api.Ptr(int64(1) << (i % 5)), XIDLast: api.F(float64(i/1000 + g))}})
		}
	}
	return recs
}

// sampleValue is metric m of g.
func sampleValue(g *api.GPU, m string) (float64, bool) {
	switch v := api.GPUMetricNamed(m).Value(g).(type) {
	case float64:
		return v, true
	case int64:
		return float64(v), true
	}
	return 0, false
}

// expectBuckets is what the samples of one GPU in [from, to] give metric
// m in buckets of width w (aligned to the Unix epoch, as date_bin does):
// the mean, lowest and highest of gauges, the bits of masks, the newest
// last XID.
func expectBuckets(recs []api.Record, host string, gpu int, m string, from, to time.Time, w time.Duration) map[time.Time]api.TimePoint {
	type acc struct {
		n                 int
		sum, lo, hi, last float64
		or, and           int64
		lastAt            time.Time
	}
	accs := map[time.Time]*acc{}
	for _, r := range recs {
		g := r.GPU
		if g == nil || g.Host != host || *g.GPU != gpu || g.Time.Before(from) || g.Time.After(to) {
			continue
		}
		v, ok := sampleValue(g, m)
		if !ok {
			continue
		}
		u := g.Time.Unix()
		b := time.Unix(u-u%int64(w/time.Second), 0).UTC()
		a := accs[b]
		if a == nil {
			a = &acc{lo: math.Inf(1), hi: math.Inf(-1), and: -1}
			accs[b] = a
		}
		a.n++
		a.sum += v
		a.lo, a.hi = math.Min(a.lo, v), math.Max(a.hi, v)
		a.or |= int64(v)
		a.and &= int64(v)
		if !g.Time.Before(a.lastAt) {
			a.last, a.lastAt = v, g.Time.Time
		}
	}
	out := map[time.Time]api.TimePoint{}
	for b, a := range accs {
		switch api.GPUMetricNamed(m).Agg {
		case api.AggBits:
			out[b] = api.TimePoint{Time: b, Value: api.Float(a.or), Min: api.Float(a.and), Max: api.Float(a.or)}
		case api.AggLast:
			out[b] = api.TimePoint{Time: b, Value: api.Float(a.last), Min: api.Float(a.lo), Max: api.Float(a.hi)}
		default:
			out[b] = api.TimePoint{Time: b, Value: api.Float(a.sum / float64(a.n)), Min: api.Float(a.lo), Max: api.Float(a.hi)}
		}
	}
	return out
}

// getBytes fetches path and returns its body, failing unless it is 200.
func (e *env) getBytes(path string) []byte {
	e.t.Helper()
	res, err := http.Get(e.srv.URL + "/api/v1" + path)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != 200 {
		e.t.Fatalf("GET %s: %d %v: %.300s", path, res.StatusCode, err, body)
	}
	return body
}

// A day of a node's 8 GPUs answers from the per-GPU minute rollups: at
// most 200 KB for the GPU nodes dashboard's charts, in buckets of whole
// minutes holding exactly what the samples inside the window give, the
// window's edges cutting minutes included.
// It answers the same while the minutes are still open (their samples
// read instead of their rows) and once they are closed.
func TestGPUDayFromMinuteRollups(t *testing.T) {
	e := newEnv(t)
	recs := daySamples()
	e.write(recs...)
	from, to := t0.Add(35*time.Second), t0.Add(24*time.Hour-25*time.Second)
	window := "&from=" + url.QueryEscape(from.Format(time.RFC3339Nano)) + "&to=" + url.QueryEscape(to.Format(time.RFC3339Nano))
	t.Run("open", func(t *testing.T) { checkGPUDay(t, e, recs, from, to, window) })
	if n := e.closeMinutes(); n != 1 {
		t.Fatalf("closed the minutes of %d hosts, want 1", n)
	}
	var rows int
	if err := storetest.Pool(t, e.s).QueryRow(context.Background(), `SELECT count(*) FROM gpu_device_minutes`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 8*(24*60-1) {
		t.Fatalf("%d minute rows once closed, want one a GPU and minute but its newest (%d)", rows, 8*(24*60-1))
	}
	t.Run("closed", func(t *testing.T) { checkGPUDay(t, e, recs, from, to, window) })
}

// closeMinutes closes every GPU minute there is to close and returns how
// many hosts it closed.
func (e *env) closeMinutes() int {
	e.t.Helper()
	n := 0
	for {
		hosts, more, err := e.s.CloseGPUMinutes(context.Background())
		if err != nil {
			e.t.Fatal(err)
		}
		n += hosts
		if !more {
			return n
		}
	}
}

// checkGPUDay holds the day's answers to what its samples give.
func checkGPUDay(t *testing.T, e *env, recs []api.Record, from, to time.Time, window string) {
	e = &env{t: t, s: e.s, srv: e.srv}

	body := e.getBytes("/gpus?host=h&max_points=1000" + window)
	if len(body) > 200_000 {
		t.Errorf("a day of 8 GPUs, default metrics: %d bytes, want at most 200 KB", len(body))
	}
	var def api.GPUResponse
	if err := json.Unmarshal(body, &def); err != nil {
		t.Fatal(err)
	}
	if len(def.Series) != 8*4 {
		t.Fatalf("%d series, want 8 GPUs × 4 metrics", len(def.Series))
	}
	t.Logf("a day of 8 GPUs × 4 metrics: %d bytes, %d points a series", len(body), len(def.Series[0].Points))

	metrics := []string{"util_pct", "mem_used_bytes", "power_w", "temp_c", "throttle_reasons", "xid_last"}
	q := "/gpus?host=h&max_points=1000" + window
	for _, m := range metrics {
		q += "&metric=" + m
	}
	var res api.GPUResponse
	e.get(q, 200, &res)
	if len(res.Series) != 8*len(metrics) {
		t.Fatalf("%d series, want 8 GPUs × %d metrics", len(res.Series), len(metrics))
	}
	for _, s := range res.Series {
		if s.UUID != fmt.Sprintf("GPU-%d", s.GPU) || s.Name != "H100" || s.RunID != "day" {
			t.Errorf("GPU %d: identity %q %q %q", s.GPU, s.UUID, s.Name, s.RunID)
		}
		if len(s.Points) < 10 {
			t.Fatalf("%s of GPU %d: %d points", s.Metric, s.GPU, len(s.Points))
		}
		w := s.Points[1].Time.Sub(s.Points[0].Time)
		if w%time.Minute != 0 || w <= time.Minute {
			t.Fatalf("%s: buckets of %v, want whole minutes sized to the answer", s.Metric, w)
		}
		want := expectBuckets(recs, "h", s.GPU, s.Metric, from, to, w)
		if len(s.Points) != len(want) {
			t.Errorf("%s of GPU %d: %d points, want %d", s.Metric, s.GPU, len(s.Points), len(want))
		}
		for _, p := range s.Points {
			x, ok := want[p.Time]
			if !ok || !near(float64(p.Value), float64(x.Value)) || p.Min != x.Min || p.Max != x.Max {
				t.Errorf("%s of GPU %d at %v: %+v, want %+v", s.Metric, s.GPU, p.Time, p, x)
				break
			}
		}
	}
}

// A window of a few minutes still answers from the samples, in buckets
// of a second, as it always did; so does one GPU of the node over a day
// from the rollups, its one series at up to max_points points.
func TestGPUShortWindowFromSamples(t *testing.T) {
	e := newEnv(t)
	recs := daySamples()[:1+8*60] // ten minutes
	e.write(recs...)
	from, to := t0.Add(2*time.Minute), t0.Add(6*time.Minute)
	var res api.GPUResponse
	e.get("/gpus?host=h&metric=util_pct&from="+url.QueryEscape(from.Format(time.RFC3339))+"&to="+url.QueryEscape(to.Format(time.RFC3339)), 200, &res)
	if len(res.Series) != 8 {
		t.Fatalf("%d series, want 8", len(res.Series))
	}
	for _, s := range res.Series {
		want := expectBuckets(recs, "h", s.GPU, "util_pct", from, to, time.Second)
		if len(s.Points) != len(want) || len(want) != 25 {
			t.Fatalf("GPU %d: %d points, want one a sample (%d)", s.GPU, len(s.Points), len(want))
		}
		for _, p := range s.Points {
			if x := want[p.Time]; p != x {
				t.Errorf("GPU %d at %v: %+v, want %+v", s.GPU, p.Time, p, x)
			}
		}
	}
	var one api.GPUResponse
	e.get("/gpus?host=h&metric=util_pct&gpu=3&max_points=7&from="+url.QueryEscape(t0.Format(time.RFC3339))+"&to="+url.QueryEscape(t0.Add(time.Hour).Format(time.RFC3339)), 200, &one)
	if len(one.Series) != 1 || one.Series[0].GPU != 3 || len(one.Series[0].Points) > 7 || one.Series[0].Points[1].Time.Sub(one.Series[0].Points[0].Time) != 2*time.Minute {
		t.Fatalf("gpu 3: %+v", one.Series)
	}
}

// BenchmarkGPUDay times the GPU nodes dashboard's chart of a node's 8
// GPUs over a day of samples a second (691,200 samples), the answer read
// from the minute rollups; it reports the answer's size.
func BenchmarkGPUDay(b *testing.B) {
	st := storetest.NewStore(b)
	e := echo.New()
	query.New(st, query.Options{}).Register(e.Group("/api/v1"))
	srv := httptest.NewServer(e)
	defer srv.Close()
	recs := daySamplesEvery(time.Second)
	ctx := context.Background()
	for len(recs) > 0 {
		n := min(len(recs), 20000)
		if _, err := st.WriteBatch(ctx, recs[:n]); err != nil {
			b.Fatal(err)
		}
		recs = recs[n:]
	}
	for more := true; more; {
		var err error
		if _, more, err = st.CloseGPUMinutes(ctx); err != nil {
			b.Fatal(err)
		}
	}
	path := srv.URL + "/api/v1/gpus?host=h&max_points=1000&from=" + url.QueryEscape(t0.Format(time.RFC3339)) +
		"&to=" + url.QueryEscape(t0.Add(24*time.Hour).Format(time.RFC3339))
	var size int
	b.ResetTimer()
	for range b.N {
		res, err := http.Get(path)
		if err != nil {
			b.Fatal(err)
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || res.StatusCode != 200 {
			b.Fatalf("%d %v", res.StatusCode, err)
		}
		size = len(body)
	}
	b.ReportMetric(float64(size), "answer_bytes")
}
