package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/server/servertest"
	"github.com/deepseed/deepseed/store/storetest"
)

// The hook's offline file and the collector's dead-letter file are sent
// with deepseed import; sending them again stores nothing twice; a bad
// line or a refused record is named by its line.
func TestImportNDJSONFiles(t *testing.T) {
	dbURL := storetest.NewDatabase(t)
	st := storetest.Open(t, dbURL, nil)
	cfg := server.DefaultConfig()
	cfg.IngestTokens = []string{"send-token"}
	base := servertest.Start(t, cfg, st)
	dir := t.TempDir()

	// As the hook writes offline: one record a line, NaN bare as Python's
	// json writes it.
	offline := filepath.Join(dir, "offline.ndjson")
	var b strings.Builder
	b.WriteString(`{"kind": "run", "run_id": "off", "project": "imdb", "name": "bert"}` + "\n")
	for s := 0; s < 2500; s++ {
		loss := "0.5"
		if s == 7 {
			loss = "NaN"
		}
		b.WriteString(`{"kind": "step", "run_id": "off", "rank": 0, "step": ` + itoa(s) + `, "time": 1700000000.5, "loss": ` + loss + `}` + "\n")
	}
	// Watched steps as the hook writes them: one steps record of columns.
	b.WriteString(`{"kind": "steps", "run_id": "off", "rank": 1, "step": [0, 1, 2], "time": 1700000000.5, "step_ms": [1.5, 2, NaN]}` + "\n")
	b.WriteString(`{"kind": "end", "run_id": "off", "status": "finished"}` + "\n")
	writeFile(t, offline, b.String())

	// The collector's dead-letter file: refused batches, records inside.
	dead := filepath.Join(dir, "dead-letter.ndjson")
	writeFile(t, dead, `{"time":"2026-11-20T10:00:00Z","status":400,"message":"x","batch":7,"records":[{"kind":"step","run_id":"dl","rank":1,"step":1,"time":1000},{"kind":"step","run_id":"dl","rank":1,"step":2,"time":1000}]}
{"time":"2026-11-20T10:00:01Z","status":400,"message":"x","batch":8,"records":[{"kind":"event","run_id":"dl","type":"note","text":"again","time":1000}]}
`)
	env := []string{"DEEPSEED_TOKEN=send-token"}
	code, _, stderr := runBinary(t, env, "import", offline, dead, "--server", base)
	if code != 0 {
		t.Fatalf("import exited %d: %s", code, stderr)
	}
	for _, want := range []string{"offline.ndjson: 2503/2503 records sent", "imported " + offline + ": 2503 records, 2505 stored, 0 already there",
		"imported " + dead + ": 3 records, 3 stored"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	counts := func() string {
		var steps, events, nan int
		if err := storetest.Pool(t, st).QueryRow(context.Background(), `SELECT (SELECT count(*) FROM steps), (SELECT count(*) FROM events),
			(SELECT count(*) FROM steps WHERE loss = 'NaN')`).Scan(&steps, &events, &nan); err != nil {
			t.Fatal(err)
		}
		return itoa(steps) + " steps, " + itoa(events) + " events, " + itoa(nan) + " NaN"
	}
	if got := counts(); got != "2505 steps, 1 events, 1 NaN" {
		t.Fatalf("stored %s", got)
	}
	// Again, from standard input for one of them: nothing twice (the run
	// and end records count as accepted: they update the run again).
	cmd := binaryCmd(t, env, "import", "-", "--server", base)
	f, err := os.Open(offline)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Stdin = f
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "2503 already there") {
		t.Fatalf("second import: %v\n%s", err, out)
	}
	if got := counts(); got != "2505 steps, 1 events, 1 NaN" {
		t.Fatalf("after sending again: %s", got)
	}

	bad := filepath.Join(dir, "bad.ndjson")
	writeFile(t, bad, `{"kind":"step","run_id":"bad","rank":0,"step":1,"time":1000}`+"\n\n"+`{"kind":"step","run_id":"bad","rank":-4,"step":2,"time":1000}`+"\n")
	code, _, stderr = runBinary(t, env, "import", bad, "--server", base)
	if code == 0 || !strings.Contains(stderr, "bad.ndjson:3:") || !strings.Contains(stderr, "rank") {
		t.Fatalf("a refused record: exit %d, %s", code, stderr)
	}
	garbage := filepath.Join(dir, "garbage.ndjson")
	writeFile(t, garbage, `{"kind":"step","run_id":"g","rank":0,"step":1,"time":1000}`+"\nnot json at all\n")
	code, _, stderr = runBinary(t, env, "import", garbage, "--server", base)
	if code == 0 || !strings.Contains(stderr, "garbage.ndjson:2: not a JSON record") {
		t.Fatalf("a malformed line: exit %d, %s", code, stderr)
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// binaryCmd is the deepseed binary with args and a clean environment.
func binaryCmd(t *testing.T, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(binary(t), args...)
	cmd.Env = append(cleanEnv(), env...)
	return cmd
}
