package server

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store/storetest"
)

// TestReadinessTellsRefresherBehindFromDatabaseDown keeps the refresher
// from a run's markers (its lock held, as a long refresh holds it) and
// requires /readyz to stay 200, saying that the rollups are behind and by
// how much, and to say they caught up once the lock is free. A database
// that does not answer is the 503 of TestReadinessFollowsDatabase.
func TestReadinessTellsRefresherBehindFromDatabaseDown(t *testing.T) {
	st := storetest.NewStore(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tx, err := storetest.Pool(t, st).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('rollup:' || $1, 0))`, "behind"); err != nil {
		t.Fatal(err)
	}
	recs := []api.Record{{Run: &api.Run{Kind: "run", RunID: "behind", Project: "p", StartedAt: api.T(t0)}}}
	for rank := 0; rank < 2; rank++ {
		for s := int64(0); s < 250; s++ {
			recs = append(recs, api.Record{Step: &api.Step{Kind: "step", RunID: "behind", Rank: rank, Step: api.Ptr(s),
				Time: api.T(t0.Add(time.Duration(s) * time.Second)), Loss: api.F(1)}})
		}
	}
	if _, err := st.WriteBatch(ctx, recs); err != nil {
		t.Fatal(err)
	}
	r := start(t, New(testConfig(), st, testLogger(t)))
	readiness := func() (int, Readiness) {
		code, body, _ := do(t, "GET", r.url+"/readyz", "", "")
		var rd Readiness
		if err := json.Unmarshal(body, &rd); err != nil {
			t.Fatalf("readyz %d: %s", code, body)
		}
		return code, rd
	}
	waitFor(t, "ready", func() bool { code, _ := readiness(); return code == 200 })
	code, rd := readiness()
	if code != 200 || !rd.Ready || rd.Rollups == nil || !rd.Rollups.Behind || rd.Rollups.Blocks != 6 {
		t.Fatalf("readyz with 2 ranks x 3 blocks waiting: %d %+v rollups %+v", code, rd, rd.Rollups)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the refresher to catch up", func() bool {
		code, rd := readiness()
		return code == 200 && rd.Rollups != nil && !rd.Rollups.Behind && rd.Rollups.Blocks == 0
	})
}
