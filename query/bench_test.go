package query_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/query"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// bigRun is a 1,000,000-step run with 100 layers, generated in SQL, shared
// by the benchmarks.
var (
	bigOnce sync.Once
	bigSrv  *httptest.Server
	bigCold time.Duration
	bigErr  error
)

const bigSteps = 1_000_000

func bigServer(b *testing.B) *httptest.Server {
	b.Helper()
	bigOnce.Do(func() {
		u := storetest.NewDatabase(b)
		s, err := store.Open(context.Background(), u, nil)
		if err != nil {
			bigErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		start := time.Now()
		for _, q := range []string{
			`INSERT INTO runs (run_id, layer_names, started_at)
			 SELECT 'big', array_agg('layer.' || i ORDER BY i), '2026-01-01' FROM generate_series(0, 99) i`,
			// Loss falls slowly with a one-step spike at 777,777.
			`INSERT INTO steps (run_id, rank, step, time, loss, step_ms)
			 SELECT 'big', 0, s, '2026-01-01'::timestamptz + s * interval '1 second',
			        CASE WHEN s = 777777 THEN 1000 ELSE 3 - s / 1e6 END, 150 + s % 13
			 FROM generate_series(0, 999999) s`,
			// 97 distinct layer profiles, cycled.
			`WITH a AS (
			   SELECT k, array_agg((1 + (i % 10) * 0.1 + k * 0.01)::float8 ORDER BY i) AS arr
			   FROM generate_series(0, 96) k, generate_series(0, 99) i GROUP BY k)
			 INSERT INTO layer_times (run_id, rank, step, time, forward_ms)
			 SELECT 'big', 0, s, '2026-01-01'::timestamptz + s * interval '1 second', a.arr
			 FROM generate_series(0, 999999) s JOIN a ON a.k = s % 97`,
			`INSERT INTO rollup_dirty SELECT 'big', 0, b FROM generate_series(0, 9999) b`,
			`ANALYZE`,
		} {
			if _, err := s.Pool.Exec(ctx, q); err != nil {
				bigErr = err
				return
			}
		}
		b.Logf("generated %d steps x 100 layers in %v", bigSteps, time.Since(start))
		e := echo.New()
		query.New(s, query.Options{Timeout: 30 * time.Minute}).Register(e.Group("/api/v1"))
		bigSrv = httptest.NewServer(e)
		// The first query refreshes every rollup: the cold cost.
		start = time.Now()
		if _, err := fetch(bigSrv.URL + "/api/v1/runs/big/heatmap?max_steps=500"); err != nil {
			bigErr = err
			return
		}
		bigCold = time.Since(start)
		b.Logf("first query (cold rollup refresh of %d steps): %v", bigSteps, bigCold)
	})
	if bigErr != nil {
		b.Fatal(bigErr)
	}
	return bigSrv
}

func fetch(u string) ([]byte, error) {
	res, err := http.Get(u)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	var raw json.RawMessage
	if err := json.NewDecoder(res.Body).Decode(&raw); err != nil {
		return nil, err
	}
	if res.StatusCode != 200 {
		return nil, &httpErr{res.StatusCode, string(raw)}
	}
	return raw, nil
}

type httpErr struct {
	code int
	body string
}

func (e *httpErr) Error() string { return e.body }

func benchGET(b *testing.B, path string, check func([]byte)) {
	srv := bigServer(b)
	var durs []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		body, err := fetch(srv.URL + path)
		durs = append(durs, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
		if i == 0 {
			check(body)
		}
	}
	sort.Slice(durs, func(i, j int) bool { return durs[i] < durs[j] })
	b.ReportMetric(float64(durs[len(durs)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(bigCold.Milliseconds()), "cold-ms")
}

// BenchmarkBigRun measures a 1,000,000-step, 100-layer run: the heatmap
// down to 500 columns and the loss series down to 1,000 points. The
// database is built once, by the parent, for both.
func BenchmarkBigRun(b *testing.B) {
	bigServer(b)
	b.Run("Heatmap500", func(b *testing.B) {
		benchGET(b, "/api/v1/runs/big/heatmap?max_steps=500", func(body []byte) {
			var hm api.Heatmap
			if err := json.Unmarshal(body, &hm); err != nil {
				b.Fatal(err)
			}
			if len(hm.Layers) != 100 || len(hm.Steps) == 0 || len(hm.Steps) > 500 {
				b.Fatalf("heatmap: %d layers, %d columns", len(hm.Layers), len(hm.Steps))
			}
		})
	})
	b.Run("Series1000", func(b *testing.B) {
		benchGET(b, "/api/v1/runs/big/series?metric=loss&max_points=1000", func(body []byte) {
			var res api.SeriesResponse
			if err := json.Unmarshal(body, &res); err != nil {
				b.Fatal(err)
			}
			pts := res.Series[0].Points
			top := 0.0
			for _, p := range pts {
				top = max(top, float64(p.Max))
			}
			if len(pts) > 1000 || top != 1000 {
				b.Fatalf("series: %d points, max %v (want the spike 1000)", len(pts), top)
			}
		})
	})
}
