package server

import (
	"sort"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/store/storetest"
)

// What each --role serves, as serve -h, docs/architecture.md and
// docs/scale-out.md say: ingest the two POST routes that take records,
// query the read routes and every job route (which write on the
// primary), all both.
func TestRolesServeWhatTheDocsSay(t *testing.T) {
	st := storetest.NewStore(t)
	common := []string{"GET /healthz", "GET /readyz", "GET /metrics", "GET /api/v1/openapi.json"}
	routes := func(role string) map[string]bool {
		cfg := testConfig()
		cfg.Role = role
		got := map[string]bool{}
		for _, r := range New(cfg, st, testLogger(t)).Routes() {
			if r.Method != "echo_route_not_found" && !strings.HasSuffix(r.Path, "/*") {
				got[r.Method+" "+r.Path] = true
			}
		}
		return got
	}
	list := func(m map[string]bool) string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		sort.Strings(out)
		return strings.Join(out, "\n  ")
	}
	ingest, query, all := routes(RoleIngest), routes(RoleQuery), routes(RoleAll)

	want := map[string]bool{"POST /api/v1/ingest": true, "POST /api/v1/import": true}
	for _, c := range common {
		want[c] = true
	}
	if list(ingest) != list(want) {
		t.Errorf("--role ingest serves\n  %s\nwant\n  %s", list(ingest), list(want))
	}
	for _, r := range []string{"GET /api/v1/runs", "GET /api/v1/compare", "POST /api/v1/jobs", "POST /api/v1/jobs/:id/cancel",
		"POST /api/v1/sweeps", "PUT /api/v1/quotas/:project", "POST /api/v1/agents/:name/claim"} {
		if !query[r] {
			t.Errorf("--role query does not serve %s", r)
		}
	}
	for r := range query {
		if r == "POST /api/v1/ingest" || r == "POST /api/v1/import" {
			t.Errorf("--role query serves %s", r)
		}
		if !strings.HasPrefix(r, "GET ") && !strings.Contains(r, "/jobs") && !strings.Contains(r, "/sweeps") &&
			!strings.Contains(r, "/quotas") && !strings.Contains(r, "/agents") {
			t.Errorf("--role query serves %s, which is neither a GET route nor a job route", r)
		}
	}
	for r := range ingest {
		if !all[r] {
			t.Errorf("--role all does not serve %s (ingest does)", r)
		}
	}
	for r := range query {
		if !all[r] {
			t.Errorf("--role all does not serve %s (query does)", r)
		}
	}
}
