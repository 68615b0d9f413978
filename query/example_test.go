package query_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/query"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// The query API over a store: a series of 1,000 steps asked for in at most
// 10 points comes back downsampled into 6 buckets of 200 steps (aligned on
// multiples of their width, as the stored rollups are), each with its
// mean, minimum, maximum and count. The heatmap, breakdown (steady-state
// window) and compare endpoints are mounted by the same Register call.
//
// Here the database is a throwaway one of the tests; yours is the URL
// serve takes (DEEPSEED_DATABASE_URL).
func ExampleHandler() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := store.Open(ctx, storetest.ExampleDatabase(), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	var body strings.Builder
	body.WriteString(`{"kind":"run","run_id":"r1","project":"imdb"}` + "\n")
	for s := 1; s <= 1000; s++ {
		fmt.Fprintf(&body, `{"kind":"step","run_id":"r1","rank":0,"step":%d,"time":%d,"step_ms":%d}`+"\n",
			s, 1735689600+s, 200+(s-1)%100+1)
	}
	recs, err := api.DecodeBatch([]byte(body.String()))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := st.WriteBatch(ctx, recs); err != nil {
		log.Fatal(err)
	}
	// A server's refresher rolls steps up in the background as they
	// arrive (a read answers from what is rolled up by then); the example
	// rolls them up at once.
	if _, err := st.RefreshRollups(ctx, "r1"); err != nil {
		log.Fatal(err)
	}

	e := echo.New()
	query.New(st, query.Options{}).Register(e.Group("/api/v1"))
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest("GET", "/api/v1/runs/r1/series?metric=step_ms&max_points=10", nil))
	var res api.SeriesResponse
	if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil || len(res.Series) == 0 {
		log.Fatalf("series: %d %s", rec.Code, rec.Body)
	}
	s := res.Series[0]
	fmt.Printf("bucket_steps %d, %d points\n", s.BucketSteps, len(s.Points))
	p := s.Points[0]
	fmt.Printf("first bucket: %d steps from step %d, mean %.2f %s (min %v, max %v)\n", p.Count, p.Step,
		float64(p.Value), s.Unit, float64(p.Min), float64(p.Max))
	// Output:
	// bucket_steps 200, 6 points
	// first bucket: 199 steps from step 1, mean 250.25 ms (min 201, max 300)
}
