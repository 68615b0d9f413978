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
	bigSt   *store.Store
	bigURL  string // bigSt's database
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
		// The database lives as long as the top-level benchmark that
		// made it; the next one builds its own.
		b.Cleanup(func() {
			if bigSrv != nil {
				bigSrv.Close()
			}
			s.Close()
			bigOnce, bigSrv, bigSt, bigErr = sync.Once{}, nil, nil, nil
		})
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
			if _, err := storetest.Pool(b, u).Exec(ctx, q); err != nil {
				bigErr = err
				return
			}
		}
		b.Logf("generated %d steps x 100 layers in %v", bigSteps, time.Since(start))
		bigSt, bigURL = s, u
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

// BenchmarkRollupBuild rebuilds every rollup of the 1,000,000-step,
// 100-layer run from nothing, as after a bulk load or an import: "Go" is
// RefreshRollups; "SQLLayerSums" is only the per-layer sums of the
// forward arrays done in SQL (unnest WITH ORDINALITY and GROUP BY, the
// cheapest SQL formulation), for comparison. Run with -benchtime 3x; the
// reported p50-ms is the median build.
func BenchmarkRollupBuild(b *testing.B) {
	bigServer(b)
	ctx := context.Background()
	exec := func(q string) {
		b.Helper()
		if _, err := storetest.Pool(b, bigURL).Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	median := func(durs []time.Duration) float64 {
		sort.Slice(durs, func(i, j int) bool { return durs[i] < durs[j] })
		return float64(durs[len(durs)/2].Microseconds()) / 1000
	}
	b.Run("Go", func(b *testing.B) {
		var durs []time.Duration
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			exec(`TRUNCATE metric_rollup_rows, metric_rollup_sets, layer_rollups, rollup_dirty`)
			exec(`INSERT INTO rollup_dirty (run_id, rank, block) SELECT 'big', 0, b FROM generate_series(0, 9999) b`)
			b.StartTimer()
			start := time.Now()
			n, err := bigSt.RefreshRollups(ctx, "big")
			durs = append(durs, time.Since(start))
			if err != nil || n != 10000 {
				b.Fatalf("refreshed %d blocks: %v", n, err)
			}
		}
		b.ReportMetric(median(durs), "p50-ms")
	})
	b.Run("SQLLayerSums", func(b *testing.B) {
		var durs []time.Duration
		for i := 0; i < b.N; i++ {
			start := time.Now()
			var n int64
			if err := storetest.Pool(b, bigURL).QueryRow(ctx, `SELECT count(*) FROM (
				SELECT l.step / 100, u.i, sum(u.v), count(u.v)
				FROM layer_times l, unnest(l.forward_ms) WITH ORDINALITY u(v, i)
				WHERE l.run_id = 'big' AND l.rank = 0 GROUP BY 1, 2) x`).Scan(&n); err != nil || n != 1_000_000 {
				b.Fatalf("%d sums: %v", n, err)
			}
			durs = append(durs, time.Since(start))
		}
		b.ReportMetric(median(durs), "p50-ms")
	})
}
