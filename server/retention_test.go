package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/promtest"
	"github.com/deepseed/deepseed/store/storetest"
)

// With --retention the server drops, at start, a run whose last write is
// older than the horizon: /runs no longer lists it and its page is 404,
// while a run imported just now with old timestamps stays.
func TestServerRetentionDropsIdleRun(t *testing.T) {
	ctx := context.Background()
	st := storetest.NewStore(t)
	old := time.Now().Add(-200 * 24 * time.Hour).UTC().Format(time.RFC3339)
	r := start(t, New(testConfig(), st, testLogger(t)))
	waitFor(t, "readyz", func() bool { code, _, _ := do(t, "GET", r.url+"/readyz", "", ""); return code == 200 })
	for _, id := range []string{"idle-run", "imported-run"} {
		body := fmt.Sprintf(`{"kind":"step","run_id":%q,"rank":0,"step":1,"time":%q,"loss":1.5}`+"\n", id, old)
		if code, b, _ := do(t, "POST", r.url+"/api/v1/ingest", "", body); code != 200 {
			t.Fatalf("ingest %s: %d %s", id, code, b)
		}
	}
	if _, err := storetest.Pool(t, st).Exec(ctx, `UPDATE runs SET updated_at = now() - interval '100 days' WHERE run_id = 'idle-run'`); err != nil {
		t.Fatal(err)
	}

	cfg := testConfig()
	cfg.Retention = 90 * 24 * time.Hour
	r = start(t, New(cfg, st, testLogger(t))) // beside the first, which has no retention
	waitFor(t, "the idle run to be dropped", func() bool {
		code, _, _ := do(t, "GET", r.url+"/api/v1/runs/idle-run", "", "")
		return code == 404
	})
	code, b, _ := do(t, "GET", r.url+"/api/v1/runs", "", "")
	if code != 200 || strings.Contains(string(b), "idle-run") || !strings.Contains(string(b), "imported-run") {
		t.Fatalf("GET /runs after retention = %d %s; want imported-run and no idle-run", code, b)
	}
}

// A run the retention job cannot drop is counted in
// deepseed_retention_failures_total, and the idle run after it is dropped
// in the same pass all the same.
func TestServerRetentionCountsFailures(t *testing.T) {
	ctx := context.Background()
	st := storetest.NewStore(t)
	old := time.Now().Add(-200 * 24 * time.Hour).UTC().Format(time.RFC3339)
	for _, id := range []string{"a-held", "b-idle"} {
		line := fmt.Sprintf(`{"kind":"step","run_id":%q,"rank":0,"step":1,"time":%q,"loss":1.5}`, id, old)
		recs, err := api.DecodeBatch([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.WriteBatch(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := storetest.Pool(t, st).Exec(ctx, `UPDATE runs SET updated_at = now() - interval '100 days'`); err != nil {
		t.Fatal(err)
	}
	// A real fault on the first run the pass meets: deleting its runs row
	// raises an error.
	if _, err := storetest.Pool(t, st).Exec(ctx, `CREATE FUNCTION test_hold_run() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'run % is held by the test', OLD.run_id; END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := storetest.Pool(t, st).Exec(ctx, `CREATE TRIGGER test_hold_run BEFORE DELETE ON runs FOR EACH ROW
		WHEN (OLD.run_id = 'a-held') EXECUTE FUNCTION test_hold_run()`); err != nil {
		t.Fatal(err)
	}

	cfg := testConfig()
	cfg.Retention = 90 * 24 * time.Hour
	r := start(t, New(cfg, st, testLogger(t)))
	failures := func() float64 {
		_, fams := promtest.Scrape(t, r.url+"/metrics")
		m := promtest.Find(fams, "deepseed_retention_failures_total", nil)
		if m == nil {
			t.Fatal("no deepseed_retention_failures_total")
		}
		return m.GetCounter().GetValue()
	}
	waitFor(t, "a retention failure to be counted", func() bool { return failures() >= 1 })
	if code, b, _ := do(t, "GET", r.url+"/api/v1/runs/b-idle", "", ""); code != 404 {
		t.Errorf("GET /runs/b-idle after the pass = %d %s; want 404, dropped past the failing run", code, b)
	}
	if code, b, _ := do(t, "GET", r.url+"/api/v1/runs/a-held", "", ""); code != 200 {
		t.Errorf("GET /runs/a-held after the pass = %d %s; want 200, kept whole", code, b)
	}
}
