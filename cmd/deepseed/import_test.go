package main

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/server/servertest"
	"github.com/deepseed/deepseed/store/storetest"
)

// deepseed import takes the repository's own export, which holds NaN, as
// POST /api/v1/import does, and a JSON array of records as POST
// /api/v1/ingest does; a file cut short says it is truncated, and no
// answer names a Go type.
func TestImportFilesInWords(t *testing.T) {
	st := storetest.Open(t, storetest.NewDatabase(t), nil)
	cfg := server.DefaultConfig()
	cfg.IngestTokens = []string{"ingest-tok"}
	base := servertest.Start(t, cfg, st)
	env := []string{"DEEPSEED_TOKEN=ingest-tok"}
	export, err := os.ReadFile("../../ingest/testdata/training_metrics.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(export, []byte("NaN")) {
		t.Fatal("the export fixture no longer holds NaN: this test no longer tests that")
	}
	code, stdout, stderr := runBinary(t, env, "import", "../../ingest/testdata/training_metrics.json", "--server", base)
	if code != 0 || !strings.Contains(stderr, "records stored") || !strings.HasPrefix(stdout, "import-") {
		t.Fatalf("import of the NaN export: exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
	}

	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	arr := write("array.json", []byte(`[{"kind":"run","run_id":"cli-array","project":"p"},
 {"kind":"run","run_id":"cli-array-2","project":"p","meta":{"lr":NaN}}]`))
	code, _, stderr = runBinary(t, env, "import", arr, "--server", base)
	if code != 0 || !strings.Contains(stderr, "2 records, 2 stored") {
		t.Errorf("import of a JSON array: exit %d\n%s", code, stderr)
	}

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(export)
	zw.Close()
	cases := []struct {
		name string
		body []byte
		want []string
	}{
		{"cut.json.gz", gz.Bytes()[:gz.Len()/2], []string{"gzip data ends early", "truncated"}},
		{"cut-export.json", export[:len(export)/2], []string{"truncated"}},
		{"cut.ndjson", []byte(`{"kind":"run","run_id":"cli-cut","project":"p"}` + "\n" + `{"kind":"step","run_`), []string{"cut.ndjson:2:", "truncated"}},
		{"cut-array.json", []byte(`[{"kind":"run","run_id":"cli-cut","project":"p"},`), []string{"JSON array", "truncated"}},
		{"numbers.json", []byte(`[1, 2]`), []string{"element 1", "not a JSON object"}},
		{"string.ndjson", []byte(`"run"` + "\n"), []string{"string.ndjson:1:", "a JSON string where an object was expected"}},
	}
	for _, c := range cases {
		p := write(c.name, c.body)
		code, _, stderr := runBinary(t, env, "import", p, "--server", base)
		oneLine(t, "import "+c.name, code, stderr, nil, c.want...)
	}
}
