package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

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
	if _, err := st.Pool.Exec(ctx, `UPDATE runs SET updated_at = now() - interval '100 days' WHERE run_id = 'idle-run'`); err != nil {
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
