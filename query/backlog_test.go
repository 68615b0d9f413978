package query_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/query"
	"github.com/deepseed/deepseed/store/storetest"
)

// dashboardPaths are the queries the provisioned dashboards make of run
// id, compared with others (as deepseed bench query sends them).
func dashboardPaths(id string, others ...string) []string {
	q := url.QueryEscape(id)
	cmp := "run=" + q
	for _, o := range others {
		cmp += "&run=" + url.QueryEscape(o)
	}
	p := "/runs/" + url.PathEscape(id)
	return []string{p, "/runs?limit=50", p + "/series?metric=loss&max_points=1000",
		p + "/series?metric=step_ms&rank=all&max_points=1000", p + "/series?metric=lateness_ms&rank=all&max_points=1000",
		p + "/ranks", p + "/breakdown", p + "/heatmap?max_steps=500", p + "/evals", p + "/memory",
		"/compare?" + cmp, "/gpus?run_id=" + q + "&host=h0&max_points=1000", "/annotations?run_id=" + q, "/alerts?run_id=" + q}
}

// backlogEnv is a query server whose requests give up after timeout, so
// that a read waiting for a refresh shows as a 503 quickly; its reads
// may refresh for as long, so that what they do refresh does not depend
// on the machine's speed.
func backlogEnv(t *testing.T, timeout time.Duration) *env {
	s := storetest.NewStore(t)
	e := echo.New()
	query.New(s, query.Options{Timeout: timeout, RefreshBudget: timeout}).Register(e.Group("/api/v1"))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return &env{t: t, s: s, srv: srv}
}

// fleetRecords are the steps [from, to) of a run of ranks ranks, every
// rank arriving at each step's synchronisation point.
func fleetRecords(id string, ranks int, from, to int64) []api.Record {
	var recs []api.Record
	for st := from; st < to; st++ {
		for r := 0; r < ranks; r++ {
			recs = append(recs, stepRec(id, r, st, func(s *api.Step) {
				s.Loss = api.F(2 + 1/float64(st+1))
				s.StepMS = api.F(100 + float64(r%7))
				s.SyncNS = api.Ptr(int64(st)*1e8 + int64(r%5)*1e6)
				s.SyncWaitMS = api.F(float64(5 - r%5))
			}))
		}
	}
	return recs
}

// getLag fetches path and returns its status, the rollup lag headers
// and the body.
func getLag(t *testing.T, e *env, path string) (code int, lagS string, blocks int64, body []byte) {
	t.Helper()
	res, err := http.Get(e.srv.URL + "/api/v1" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ = io.ReadAll(res.Body)
	if h := res.Header.Get(query.RollupLagBlocksHeader); h != "" {
		if blocks, err = strconv.ParseInt(h, 10, 64); err != nil {
			t.Fatalf("%s: %s %q", path, query.RollupLagBlocksHeader, h)
		}
	}
	return res.StatusCode, res.Header.Get(query.RollupLagHeader), blocks, body
}

// TestEveryViewAnswersWhileARefreshHoldsTheRun holds the run's refresh
// lock, as a long background refresh of a freshly loaded run does, and
// requires every dashboard query to answer 200 from the rollups as they
// are, saying how far behind they are, instead of waiting for the lock
// until the request's deadline (a 503).
func TestEveryViewAnswersWhileARefreshHoldsTheRun(t *testing.T) {
	e := backlogEnv(t, 5*time.Second)
	e.write(runRec("held", nil))
	e.write(fleetRecords("held", 4, 0, 300)...)

	ctx := context.Background()
	tx, err := storetest.Pool(t, e.s).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('rollup:' || $1, 0))`, "held"); err != nil {
		t.Fatal(err)
	}
	for _, p := range dashboardPaths("held") {
		code, _, _, body := getLag(t, e, p)
		if code != http.StatusOK {
			t.Errorf("%s while a refresh holds the run: %d %.200s", p, code, body)
		}
	}
	code, lagS, blocks, body := getLag(t, e, "/runs/held")
	var sum api.RunDetail
	if err := json.Unmarshal(body, &sum); code != http.StatusOK || err != nil {
		t.Fatalf("summary: %d %v", code, err)
	}
	if sum.RollupLag == nil || sum.RollupLag.Blocks != 12 || blocks != 12 || lagS == "" {
		t.Errorf("summary while 4 ranks x 3 blocks wait: rollup_lag %+v, headers %q s and %d blocks; want 12 blocks", sum.RollupLag, lagS, blocks)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Free again, the read refreshes the small backlog itself.
	code, lagS, blocks, body = getLag(t, e, "/runs/held")
	sum = api.RunDetail{}
	if err := json.Unmarshal(body, &sum); code != http.StatusOK || err != nil {
		t.Fatalf("summary: %d %v", code, err)
	}
	if sum.RollupLag != nil || blocks != 0 || lagS == "" || sum.Steps != 300 {
		t.Errorf("summary once free: rollup_lag %+v, headers %q s and %d blocks, %d steps; want no lag and 300 steps", sum.RollupLag, lagS, blocks, sum.Steps)
	}
}

// bulkStepsEnv sets the steps of TestEveryViewAnswersAfterABulkLoadOf1024Ranks:
// 300 in the suite; 5000 is the full-size check of a bulk load.
const bulkStepsEnv = "DEEPSEED_TEST_BULK_STEPS"

// TestEveryViewAnswersAfterABulkLoadOf1024Ranks loads a run of 1,024
// ranks with no refresher running, a backlog larger than any read
// refreshes itself, and requires every dashboard query to answer 200
// and the summary and the runs list to say how far behind the rollups
// are. Then the background refresher starts on the freshly loaded run
// (its statistics stale, its refresh holding the run's lock for seconds
// at a time) and every query must go on answering 200, round after
// round, until the rollups have caught up with every step.
func TestEveryViewAnswersAfterABulkLoadOf1024Ranks(t *testing.T) {
	if testing.Short() {
		t.Skip("loads 307,200 steps")
	}
	steps := int64(300)
	if v := os.Getenv(bulkStepsEnv); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 100 {
			t.Fatalf("%s=%q: want a number of steps of at least 100", bulkStepsEnv, v)
		}
		steps = n
	}
	const ranks = 1024
	e := backlogEnv(t, 30*time.Second)
	e.write(runRec("bulk", nil))
	for from := int64(0); from < steps; from += 20 {
		e.write(fleetRecords("bulk", ranks, from, min(from+20, steps))...)
	}
	blocksWant := ranks * ((steps + 99) / 100)
	for _, p := range dashboardPaths("bulk") {
		start := time.Now()
		code, lagS, blocks, body := getLag(t, e, p)
		t.Logf("after the load: %d in %s, lag %s s over %d blocks: %s", code, time.Since(start).Round(time.Millisecond), lagS, blocks, p)
		if code != http.StatusOK {
			t.Errorf("%s after the load: %d %.200s", p, code, body)
		}
		if lagS != "" && blocks == 0 {
			t.Errorf("%s: a lag of %s s over no blocks", p, lagS)
		}
	}
	var sum api.RunDetail
	e.get("/runs/bulk", http.StatusOK, &sum)
	if sum.RollupLag == nil || sum.RollupLag.Blocks != blocksWant {
		t.Errorf("summary after the load: rollup_lag %+v, want %d blocks", sum.RollupLag, blocksWant)
	}
	var list api.RunList
	e.get("/runs", http.StatusOK, &list)
	if len(list.Runs) != 1 || list.Runs[0].RollupLag == nil || list.Runs[0].RollupLag.Blocks != blocksWant {
		t.Errorf("runs list after the load: %+v", list.Runs)
	}
	if t.Failed() {
		return
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); query.RunRefresher(ctx, e.s, 100*time.Millisecond, nil) }()
	defer func() { cancel(); <-done }()
	start := time.Now()
	deadline := start.Add(15 * time.Minute)
	for round := 1; ; round++ {
		for _, p := range dashboardPaths("bulk") {
			if code, _, _, body := getLag(t, e, p); code != http.StatusOK {
				t.Fatalf("%s in round %d while the refresher drains the load: %d %.200s", p, round, code, body)
			}
		}
		sum = api.RunDetail{}
		e.get("/runs/bulk", http.StatusOK, &sum)
		if sum.RollupLag == nil {
			if sum.Steps != steps {
				t.Fatalf("summary once rolled up: %d steps, want %d", sum.Steps, steps)
			}
			t.Logf("rolled up after %d rounds of every query, %s after the refresher started", round, time.Since(start).Round(time.Second))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rollups still %d blocks behind after round %d", sum.RollupLag.Blocks, round)
		}
	}
}
