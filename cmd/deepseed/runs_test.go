package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

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
