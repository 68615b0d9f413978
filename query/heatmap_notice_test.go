package query_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/ingest"
)

// An export whose layer times are forward only (plain numbers) has no
// backward heatmap: the answer says "no backward timings" and has no
// cells, rather than columns of nulls; the forward heatmap is whole.
func TestHeatmapWithoutBackwardTimingsSaysSo(t *testing.T) {
	e := newEnv(t)
	var steps []string
	for i := 1; i <= 1200; i++ {
		steps = append(steps, fmt.Sprintf(`{"step": %d, "loss": 1.5, "layer_times": {"embeddings": 1.5, "encoder.0": 2.5, "classifier": 0.5}}`, i))
	}
	export := `{"meta": {"model": "tiny"}, "steps": [` + strings.Join(steps, ",") + `]}`
	recs, err := ingest.ParseExport([]byte(export), ingest.ImportOptions{RunID: "fwd-only", Project: "p"})
	if err != nil {
		t.Fatal(err)
	}
	e.write(recs...)
	for _, q := range []string{"max_steps=5000", "max_steps=10"} { // raw rows, then rollups
		var bwd api.Heatmap
		e.get("/runs/fwd-only/heatmap?pass=backward&"+q, 200, &bwd)
		if !strings.HasPrefix(bwd.Notice, "no backward timings") || len(bwd.Steps) != 0 || len(bwd.Times) != 0 {
			t.Errorf("%s: backward heatmap notice %q, %d columns; want the notice and no columns", q, bwd.Notice, len(bwd.Steps))
		}
		for i, row := range bwd.Values {
			if len(row) != 0 {
				t.Errorf("%s: backward row %d has %d cells", q, i, len(row))
			}
		}
		var fwd api.Heatmap
		e.get("/runs/fwd-only/heatmap?pass=forward&"+q, 200, &fwd)
		if fwd.Notice != "" || len(fwd.Steps) == 0 || len(fwd.Values) != 3 {
			t.Fatalf("%s: forward heatmap notice %q, %d columns, %d rows", q, fwd.Notice, len(fwd.Steps), len(fwd.Values))
		}
		for _, row := range fwd.Values {
			for j, v := range row {
				if v == nil {
					t.Fatalf("%s: forward cell %d is null", q, j)
				}
			}
		}
	}
	var none api.Heatmap
	e.write(runRec("no-layers", nil))
	e.get("/runs/no-layers/heatmap", 200, &none)
	if !strings.HasPrefix(none.Notice, "no layer timings") {
		t.Errorf("run without layers: notice %q", none.Notice)
	}
}

// A run whose hook could not time its layers (a model compiled whole)
// says so in its meta's layer_times; its heatmap gives that sentence as
// the reason, not a bare "no layer timings".
func TestHeatmapSaysWhyLayersWereNotTimed(t *testing.T) {
	e := newEnv(t)
	why := "unavailable: the model is compiled whole (torch.compile), so its layers run inside one graph; compile each block instead (block.compile()) to time them"
	meta := &api.RunMeta{Model: "gpt", Extra: map[string]json.RawMessage{"layer_times": json.RawMessage(strconv.Quote(why))}}
	e.write(runRec("compiled", meta), stepRec("compiled", 0, 1, nil))
	var h api.Heatmap
	e.get("/runs/compiled/heatmap?pass=forward", 200, &h)
	if h.Notice != "no per-layer times in this run: the model is compiled whole (torch.compile), so its layers run inside one graph; compile each block instead (block.compile()) to time them" {
		t.Errorf("notice %q", h.Notice)
	}
}
