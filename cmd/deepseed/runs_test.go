package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/server/servertest"
	"github.com/deepseed/deepseed/store/storetest"
)

// deepseed runs and deepseed run show read a run back, as a table and
// as the server's JSON, with the figures a user checks first.
func TestRunsAndRunShow(t *testing.T) {
	st := storetest.Open(t, storetest.NewDatabase(t), nil)
	cfg := server.DefaultConfig()
	cfg.IngestTokens = []string{"ingest-tok"}
	base := servertest.Start(t, cfg, st)
	env := []string{"DEEPSEED_TOKEN=ingest-tok", "DEEPSEED_SERVER_URL=" + base}
	code, stdout, stderr := runBinary(t, env, "import", "../../ingest/testdata/training_metrics.json", "--project", "imdb")
	if code != 0 {
		t.Fatalf("import: exit %d: %s", code, stderr)
	}
	id := strings.TrimSpace(stdout)

	code, stdout, stderr = runBinary(t, env, "runs", "--project", "imdb")
	if code != 0 || !strings.Contains(stdout, "RUN") || !strings.Contains(stdout, "MFU") ||
		!regexp.MustCompile(regexp.QuoteMeta(id)+`\s+imdb\s+\S+\s+finished\s+[1-9]\d*\s`).MatchString(stdout) {
		t.Errorf("deepseed runs: exit %d, stderr %q:\n%s", code, stderr, stdout)
	}
	code, stdout, _ = runBinary(t, env, "runs", "--json")
	var l api.RunList
	if code != 0 || json.Unmarshal([]byte(stdout), &l) != nil || len(l.Runs) != 1 || l.Runs[0].RunID != id {
		t.Errorf("deepseed runs --json: exit %d:\n%s", code, stdout)
	}

	code, stdout, stderr = runBinary(t, env, "run", "show", id)
	for _, want := range []string{"status", "finished", "steps", "final loss", "mean step ms", "mean MFU", "stragglers", "open alerts"} {
		if code != 0 || !strings.Contains(stdout, want) {
			t.Errorf("deepseed run show: exit %d, stderr %q, lacks %q:\n%s", code, stderr, want, stdout)
		}
	}
	code, stdout, _ = runBinary(t, env, "run", "show", id, "--json")
	var r api.RunDetail
	if code != 0 || json.Unmarshal([]byte(stdout), &r) != nil || r.RunID != id || r.Steps == 0 {
		t.Errorf("deepseed run show --json: exit %d:\n%s", code, stdout)
	}
	code, _, stderr = runBinary(t, env, "run", "show", "no-such-run")
	oneLine(t, "run show of an unknown run", code, stderr, nil, "run show: ")
}

// A run whose rollups are behind its records (just loaded, or a server
// catching up) answers with figures that count what was rolled up so far
// and says so (rollup_lag); the commands say it too, rather than show a
// finished run's partial step count as if it were the run's. The answers
// are the API's, served on loopback.
func TestRunsSayWhenFiguresAreBehind(t *testing.T) {
	started := time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)
	sum := api.RunSummary{RunID: "loading", Project: "p", Status: "finished", Steps: 0, StartedAt: &started,
		RollupLag: &api.RollupLag{Blocks: 12, BehindS: 3}}
	done := api.RunSummary{RunID: "done", Project: "p", Status: "finished", Steps: 301, StartedAt: &started}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body any
		switch r.URL.Path {
		case "/api/v1/runs":
			body = api.RunList{Runs: []api.RunSummary{sum, done}, Total: 2, Limit: 50}
		case "/api/v1/runs/loading":
			body = api.RunDetail{RunSummary: sum}
		case "/api/v1/runs/loading/ranks":
			body = api.RanksResponse{RunID: "loading"}
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(body)
	}))
	defer srv.Close()
	env := []string{"DEEPSEED_SERVER_URL=" + srv.URL}

	code, stdout, stderr := runBinary(t, env, "runs")
	if code != 0 || !regexp.MustCompile(`(?m)^loading\s+p\s+-\s+finished\s+0\*\s`).MatchString(stdout) ||
		!regexp.MustCompile(`(?m)^done\s+p\s+-\s+finished\s+301\s`).MatchString(stdout) ||
		!strings.Contains(stdout, "* 1 of these runs are still being rolled up") {
		t.Errorf("deepseed runs: exit %d, stderr %q:\n%s", code, stderr, stdout)
	}
	code, stdout, stderr = runBinary(t, env, "run", "show", "loading")
	if code != 0 || !strings.Contains(stdout, "behind by 12 blocks of 100 steps") {
		t.Errorf("deepseed run show: exit %d, stderr %q:\n%s", code, stderr, stdout)
	}
}
