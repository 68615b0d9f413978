package query_test

import (
	"encoding/json"
	"os"
	"regexp"
	"testing"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/ingest"
)

// Byte counts are whole numbers written as integers: the seed export's
// 4.022 GB of optimizer state is 4022000000, not 4.0220000000000005e+09.
func TestMemoryBytesAreIntegers(t *testing.T) {
	e := newEnv(t)
	body, err := os.ReadFile("../ingest/testdata/training_metrics.json")
	if err != nil {
		t.Fatal(err)
	}
	recs, err := ingest.ParseExport(body, ingest.ImportOptions{RunID: "seed", Project: "imdb"})
	if err != nil {
		t.Fatal(err)
	}
	e.write(recs...)
	var raw json.RawMessage
	e.get("/runs/seed/memory", 200, &raw)
	byteField := regexp.MustCompile(`"(bytes|predicted_gpu_bytes|peak_gpu_bytes|gpu_total_bytes)":\s*([^,}\]]+)`)
	integer := regexp.MustCompile(`^-?[0-9]+$`)
	found := 0
	for _, m := range byteField.FindAllStringSubmatch(string(raw), -1) {
		found++
		if m[2] != "null" && !integer.MatchString(m[2]) {
			t.Errorf("%s = %s, want an integer (%s)", m[1], m[2], raw)
		}
	}
	if found < 5 {
		t.Fatalf("only %d byte fields in %s", found, raw)
	}
	var mem api.MemoryResponse
	if err := json.Unmarshal(raw, &mem); err != nil {
		t.Fatal(err)
	}
	for _, p := range mem.Parts {
		if p.Name == "optimizer" && (p.Bytes != 4022000000 || p.Device != "cpu") {
			t.Errorf("optimizer part %+v, want 4022000000 bytes on cpu", p)
		}
	}
}
