package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/query"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// openStore opens a store on url, closed when the test ends.
func openStore(t *testing.T, url string) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// stepsBody is the NDJSON of steps from..to-1 of run id, one a second.
func stepsBody(id string, from, to int) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		fmt.Fprintf(&b, `{"kind":"step","run_id":"%s","rank":0,"step":%d,"time":%d,"loss":%g,"step_ms":100}`+"\n",
			id, i, 1767225600+i, 2.0-float64(i)/10000)
	}
	return b.String()
}

func tokenConfig(role string) Config {
	cfg := testConfig()
	cfg.Role = role
	cfg.IngestTokens = []string{ingestToken}
	cfg.ReadTokens = []string{readToken}
	return cfg
}

// getJSON GETs url with the read token into v; it fails the test on any
// answer but 200, a 500 above all.
func getJSON(t *testing.T, url string, v any) http.Header {
	t.Helper()
	code, body, hdr := do(t, "GET", url, readToken, "")
	if code != 200 {
		t.Fatalf("GET %s: %d %s", url, code, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v in %s", url, err, body)
	}
	return hdr
}

// The query side scales out on PostgreSQL's own replication: a run
// written through an ingest server on the primary is read back through a
// query server on a streaming standby; while the standby's replay is
// paused the query server answers what the standby has, saying how far
// behind it is, and the new data arrives once replay resumes.
func TestQueryServerReadsFromStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary and a standby of its own")
	}
	pair := storetest.NewReplicated(t)
	ing := start(t, New(tokenConfig(RoleIngest), openStore(t, pair.PrimaryURL), testLogger(t)))
	waitFor(t, "ingest server ready", func() bool { code, _, _ := do(t, "GET", ing.url+"/readyz", "", ""); return code == 200 })
	standby := openStore(t, pair.StandbyURL)
	qs := start(t, NewReading(tokenConfig(RoleQuery), openStore(t, pair.PrimaryURL), standby, testLogger(t)))
	waitFor(t, "query server ready", func() bool { code, _, _ := do(t, "GET", qs.url+"/readyz", "", ""); return code == 200 })

	var rd Readiness
	getJSON(t, qs.url+"/readyz", &rd)
	if rd.ReadDatabase == nil || !rd.ReadDatabase.Ready || !rd.ReadDatabase.Standby || rd.ReadDatabase.ReplicaLagS == nil {
		t.Fatalf("readyz of the query server: %+v, want its read database ready, a standby, with a lag", rd)
	}

	ingest := func(body string) {
		t.Helper()
		if code, b, _ := do(t, "POST", ing.url+"/api/v1/ingest", ingestToken, body); code != 200 {
			t.Fatalf("ingest: %d %s", code, b)
		}
	}
	// The query server writes nowhere near the standby: it answers
	// reads whatever it finds there, and never 500.
	runURL := qs.url + "/api/v1/runs/rep-run"
	seriesURL := runURL + "/series?metric=loss&max_points=5"
	if code, body, _ := do(t, "GET", runURL, readToken, ""); code != 404 {
		t.Fatalf("a run not written yet: %d %s, want 404", code, body)
	}
	ingest(`{"kind":"run","run_id":"rep-run","project":"p","name":"replicated"}` + "\n" + stepsBody("rep-run", 0, 1000))

	lastStep := func() int64 {
		code, body, _ := do(t, "GET", runURL, readToken, "")
		if code == 404 {
			return -1
		}
		if code != 200 {
			t.Fatalf("GET %s: %d %s", runURL, code, body)
		}
		var d api.RunDetail
		if err := json.Unmarshal(body, &d); err != nil || d.LastStep == nil {
			return -1
		}
		return *d.LastStep
	}
	waitFor(t, "the run on the standby", func() bool { return lastStep() == 999 })
	var d api.RunDetail
	getJSON(t, runURL, &d)
	if d.Status != api.StatusRunning || d.ReplicaLagS == nil {
		t.Fatalf("a running run read from a standby: status %q, replica_lag_s %v; want running with a lag", d.Status, d.ReplicaLagS)
	}
	// Five points over 1,000 steps come from the rollups, which the query
	// server refreshes on the primary and then finds on the standby.
	lastPoint := func() (api.SeriesResponse, int64) {
		var sr api.SeriesResponse
		getJSON(t, seriesURL, &sr)
		if len(sr.Series) != 1 || len(sr.Series[0].Points) == 0 {
			t.Fatalf("series: %+v", sr)
		}
		pts := sr.Series[0].Points
		var n int64
		for _, p := range pts {
			n += p.Count
		}
		return sr, n
	}
	if sr, n := lastPoint(); n != 1000 || sr.Series[0].BucketSteps < 100 {
		t.Fatalf("series from the standby: %d steps in buckets of %d, want 1000 from the rollups", n, sr.Series[0].BucketSteps)
	}

	pair.PauseReplay(t)
	ingest(stepsBody("rep-run", 1000, 2000))
	// The standby still has 1,000 steps; the answers say it is behind.
	waitFor(t, "a lag on the run while the standby is paused", func() bool {
		var d api.RunDetail
		hdr := getJSON(t, runURL, &d)
		lag, err := strconv.ParseFloat(hdr.Get(query.ReplicaLagHeader), 64)
		return d.ReplicaLagS != nil && *d.ReplicaLagS > 0 && err == nil && lag > 0
	})
	if n := lastStep(); n != 999 {
		t.Fatalf("last step on the paused standby: %d, want 999", n)
	}
	sr, n := lastPoint()
	if n != 1000 || sr.ReplicaLagS == nil || *sr.ReplicaLagS <= 0 {
		t.Fatalf("series on the paused standby: %d steps, replica_lag_s %v; want the 1000 it has and a lag", n, sr.ReplicaLagS)
	}
	code, metrics, _ := do(t, "GET", qs.url+"/metrics", "", "")
	if code != 200 || !strings.Contains(string(metrics), "deepseed_replica_lag_seconds ") {
		t.Fatalf("metrics: %d without deepseed_replica_lag_seconds", code)
	}

	pair.ResumeReplay(t)
	waitFor(t, "the new steps on the standby", func() bool { return lastStep() == 1999 })
	waitFor(t, "all 2,000 steps in the series", func() bool { _, n := lastPoint(); return n == 2000 })
	waitFor(t, "the lag gone", func() bool {
		var d api.RunDetail
		getJSON(t, runURL, &d)
		return d.ReplicaLagS != nil && *d.ReplicaLagS == 0
	})

	// With the primary gone the query server stays ready on its standby,
	// says what is wrong with the primary, and answers reads.
	ingest(stepsBody("rep-run", 2000, 2100))
	waitFor(t, "the last steps on the standby", func() bool { return lastStep() == 2099 })
	pair.StopPrimary(t)
	waitFor(t, "readyz naming the primary's problem", func() bool {
		var rd Readiness
		getJSON(t, qs.url+"/readyz", &rd)
		return rd.Ready && rd.PrimaryError != ""
	})
	for i := 0; i < 3; i++ {
		if _, n := lastPoint(); n < 2000 {
			t.Fatalf("series with the primary away: %d steps, want the 2,000 the standby's rollups hold", n)
		}
		getJSON(t, runURL, &d)
	}
}

// A server whose only database is a standby refuses to run, saying which
// flags to give, and while it is still up answers 503, never 500: a
// standby refuses writes, and reads that refresh rollups write.
func TestServerOnStandbyAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary and a standby of its own")
	}
	pair := storetest.NewReplicated(t)
	primary := openStore(t, pair.PrimaryURL)
	if _, err := primary.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A run long enough for its series to need a rollup refresh.
	ps := httptest.NewServer(New(tokenConfig(RoleAll), primary, testLogger(t)).Handler())
	defer ps.Close()
	if code, b, _ := do(t, "POST", ps.URL+"/api/v1/ingest", ingestToken, `{"kind":"run","run_id":"sb-run"}`+"\n"+stepsBody("sb-run", 0, 1000)); code != 200 {
		t.Fatalf("ingest: %d %s", code, b)
	}
	standby := openStore(t, pair.StandbyURL)
	waitFor(t, "the run on the standby", func() bool {
		_, err := standby.GetRun(context.Background(), "sb-run")
		return err == nil
	})

	for _, role := range []string{RoleQuery, RoleIngest, RoleAll} {
		srv := New(tokenConfig(role), standby, testLogger(t))
		err := srv.Prepare(context.Background())
		if err == nil || !strings.Contains(err.Error(), "hot standby") || !strings.Contains(err.Error(), "--read-database-url") {
			t.Fatalf("role %s on a standby alone: Prepare = %v, want an error naming the standby and --read-database-url", role, err)
		}
	}

	// Before Prepare stops it, a server on the standby alone answers
	// what needs a write with 503.
	hs := httptest.NewServer(New(tokenConfig(RoleAll), standby, testLogger(t)).Handler())
	defer hs.Close()
	for _, u := range []string{"/api/v1/runs/sb-run/series?max_points=5", "/api/v1/runs/sb-run"} {
		if code, body, _ := do(t, "GET", hs.URL+u, readToken, ""); code != 503 {
			t.Errorf("GET %s on a standby alone: %d %s, want 503", u, code, body)
		}
	}
	if code, body, _ := do(t, "POST", hs.URL+"/api/v1/ingest", ingestToken, stepsBody("sb-run", 1000, 1001)); code != 503 {
		t.Errorf("ingest on a standby alone: %d %s, want 503", code, body)
	}
}
