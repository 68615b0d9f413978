package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
	"github.com/grafana/grafana-plugin-sdk-go/data"
	"github.com/grafana/grafana-plugin-sdk-go/experimental"

	"github.com/deepseed/deepseed/api"
)

// gptLayers is a GPT-like model's layer list: an embedding several times
// slower than the rest, 24 transformer blocks a few per cent apart, and a
// tiny final norm.
func gptLayers() []string {
	names := []string{"transformer.wte"}
	for i := 0; i < 24; i++ {
		names = append(names, fmt.Sprintf("transformer.h.%d", i))
	}
	return append(names, "transformer.ln_f")
}

// gptForward is layer i's forward milliseconds at step.
func gptForward(i, step int) float64 {
	switch {
	case i == 0:
		return 14 + float64(step%3)
	case i == 25:
		return 0.05
	}
	// Later blocks slightly slower, and a little jitter over steps.
	return 1.2 + 0.01*float64(i) + 0.002*float64(step%4)
}

// TestHeatmapFramesReadLikeTheSeed runs a heatmap query through the
// SDK's gRPC harness against a real server holding a 26-layer run and
// checks what the Heatmap panel is given: columns labelled by step, rows
// named by the full layer names in model order, transformer blocks that
// span the colour range instead of sharing one colour, and every cell's
// absolute milliseconds available to its tooltip.
func TestHeatmapFramesReadLikeTheSeed(t *testing.T) {
	base := startServer(t)
	layers := gptLayers()
	recs := []map[string]any{{
		"kind": "run", "run_id": "gpt", "project": "lm", "name": "GPT", "started_at": ts(0),
		"meta": map[string]any{"model": "gpt2-medium", "world_size": 1},
	}}
	const steps = 40
	for step := 1; step <= steps; step++ {
		fwd := make([]float64, len(layers))
		for i := range layers {
			fwd[i] = gptForward(i, step)
		}
		recs = append(recs, map[string]any{"kind": "layers", "run_id": "gpt", "rank": 0, "step": step,
			"time": ts(time.Duration(step) * time.Second), "names": layers, "forward_ms": fwd})
	}
	ingest(t, base, recs)
	tp := startPlugin(t)

	resp, err := tp.Client.QueryData(context.Background(), &backend.QueryDataRequest{
		PluginContext: pluginContext("heatmap", base, readToken),
		Queries: []backend.DataQuery{{RefID: "A", JSON: json.RawMessage(`{"queryType":"heatmap","runId":"gpt","pass":"forward","maxSteps":100}`),
			MaxDataPoints: 1000, TimeRange: backend.TimeRange{From: t0.Add(-time.Hour), To: t0.Add(time.Hour)}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	dr := resp.Responses["A"]
	if dr.Error != nil || len(dr.Frames) != 1 {
		t.Fatalf("error %v, %d frames", dr.Error, len(dr.Frames))
	}
	f := dr.Frames[0]
	// The frontend's tests read this frame as Grafana receives it.
	experimental.CheckGoldenJSONResponse(t, "testdata", "heatmap_gpt.golden", &dr, *update)

	// The server's own answer, to compare the cells with.
	var want api.Heatmap
	req, _ := http.NewRequest(http.MethodGet, base+"/api/v1/runs/gpt/heatmap?pass=forward&max_steps=100", nil)
	req.Header.Set("Authorization", "Bearer "+readToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if err := json.NewDecoder(res.Body).Decode(&want); err != nil {
		t.Fatal(err)
	}
	if len(want.Steps) != steps {
		t.Fatalf("server: %d columns, want one per step", len(want.Steps))
	}

	// x: the step, a number field labelled "Step".
	if f.Meta == nil || f.Meta.Type != FrameTypeHeatmapRows {
		t.Fatalf("frame type %v, want %s", f.Meta, FrameTypeHeatmapRows)
	}
	x := f.Fields[0]
	if x.Name != "step" || x.Type() != data.FieldTypeInt64 || x.Config == nil || x.Config.DisplayNameFromDS != "Step" {
		t.Fatalf("x field %s %s %+v, want step int64 labelled Step", x.Name, x.Type(), x.Config)
	}
	for j, s := range want.Steps {
		if got := x.At(j).(int64); got != s {
			t.Errorf("column %d: step %d, want %d", j, got, s)
		}
	}

	// y: one field per layer, full names, model order.
	if len(f.Fields) != len(layers)+1 {
		t.Fatalf("%d fields for %d layers", len(f.Fields), len(layers))
	}
	for i, name := range layers {
		if f.Fields[i+1].Name != name || f.Fields[i+1].Config.Unit != "ms" {
			t.Errorf("row %d: %q unit %q, want %q in ms", i, f.Fields[i+1].Name, f.Fields[i+1].Config.Unit, name)
		}
	}

	// Colour: the range is that of the transformer blocks; the embedding
	// and the final norm lie beyond it.
	lo, _ := f.Meta.Custom.(map[string]any)["colour_min_ms"].(float64)
	hi, _ := f.Meta.Custom.(map[string]any)["colour_max_ms"].(float64)
	if lo < gptForward(25, 0) || hi > gptForward(0, 0) || lo > gptForward(1, 0) || hi < gptForward(24, 3) {
		t.Fatalf("colour range %v–%v ms, want that of the blocks (%v–%v)", lo, hi, gptForward(1, 0), gptForward(24, 3))
	}
	// The first and last block are at opposite ends of it: a linear scale
	// over all cells would have put them within 2% of each other.
	first, last := cellAt(t, f, 2, 0), cellAt(t, f, 25, 0)
	if (last-first)/(hi-lo) < 0.5 {
		t.Errorf("blocks 0 and 23 span %.0f%% of the colour range", 100*(last-first)/(hi-lo))
	}

	// Tooltip: every cell's value is its absolute time, or a value
	// mapped to it; mapped values sit at the range's ends.
	var mapper data.ValueMapper
	if m := f.Fields[1].Config.Mappings; len(m) == 1 {
		mapper, _ = m[0].(data.ValueMapper)
	}
	if len(mapper) == 0 {
		t.Fatal("no value mapping on the first layer field")
	}
	mapped := 0
	for i := range layers {
		for j := range want.Steps {
			truth := float64(*want.Values[i][j])
			got := cellAt(t, f, i+1, j)
			if got == truth && got >= lo && got <= hi {
				continue
			}
			r, ok := mapper[jsNumber(got)]
			if !ok {
				t.Errorf("%s step %d: colour value %v differs from %v ms and is not mapped", layers[i], want.Steps[j], got, truth)
				continue
			}
			mapped++
			if wantText := fmt.Sprintf("%.3f ms", truth); r.Text[:len(wantText)] != wantText {
				t.Errorf("%s step %d: tooltip %q, want %s", layers[i], want.Steps[j], r.Text, wantText)
			}
			if math.Abs(got-hi) > (hi-lo)*1e-3 && math.Abs(got-lo) > (hi-lo)*1e-3 {
				t.Errorf("%s step %d: moved to %v, not to the range's end", layers[i], want.Steps[j], got)
			}
		}
	}
	// The colour legend is labelled with the smallest and largest cell
	// values: true times, printed by the unit, never a mapping's text
	// (which would run the two labels together).
	cmin, cmax := math.Inf(1), math.Inf(-1)
	for i := range layers {
		for j := range want.Steps {
			v := cellAt(t, f, i+1, j)
			cmin, cmax = min(cmin, v), max(cmax, v)
		}
	}
	if _, ok := mapper[jsNumber(cmin)]; ok || cmin != lo {
		t.Errorf("legend's low end %v: want the range's end %v, unmapped", cmin, lo)
	}
	if _, ok := mapper[jsNumber(cmax)]; ok || cmax != hi {
		t.Errorf("legend's high end %v: want the range's end %v, unmapped", cmax, hi)
	}
	if mapped != 2*steps || len(mapper) != mapped {
		t.Errorf("%d cells mapped, %d mappings; want the embedding's and the norm's %d cells", mapped, len(mapper), 2*steps)
	}
	if len(f.Meta.Notices) != 1 {
		t.Errorf("notices %v, want one saying what the colours span", f.Meta.Notices)
	}

	// On the time axis the columns are the buckets' start times.
	resp, err = tp.Client.QueryData(context.Background(), &backend.QueryDataRequest{
		PluginContext: pluginContext("heatmap", base, readToken),
		Queries: []backend.DataQuery{{RefID: "T", JSON: json.RawMessage(`{"queryType":"heatmap","runId":"gpt","xAxis":"time","maxSteps":100}`),
			TimeRange: backend.TimeRange{From: t0.Add(-time.Hour), To: t0.Add(time.Hour)}}},
	})
	if err != nil || resp.Responses["T"].Error != nil {
		t.Fatal(err, resp.Responses["T"].Error)
	}
	if tx := resp.Responses["T"].Frames[0].Fields[0]; tx.Type() != data.FieldTypeTime || !tx.At(0).(time.Time).Equal(want.Times[0]) {
		t.Errorf("time x: %s %v, want %v", tx.Type(), tx.At(0), want.Times[0])
	}
}

func cellAt(t *testing.T, f *data.Frame, field, row int) float64 {
	t.Helper()
	v, ok := f.Fields[field].ConcreteAt(row)
	if !ok {
		t.Fatalf("%s row %d: null", f.Fields[field].Name, row)
	}
	return v.(float64)
}

// Without outliers nothing moves and nothing is mapped; with most cells
// equal the colour range is the full one.
func TestColourRangeLeavesOrdinaryDataAlone(t *testing.T) {
	v := func(xs ...float64) []*float64 {
		out := make([]*float64, len(xs))
		for i := range xs {
			out[i] = &xs[i]
		}
		return out
	}
	rows := [][]*float64{v(1, 1.1, 1.2), v(1.3, 1.4, 1.5), {nil, nil, nil}}
	s := clipToColourRange(rows)
	if !s.ok || len(s.mapped) != 0 || s.lo != 1 || s.hi != 1.5 || *rows[0][0] != 1 || *rows[1][2] != 1.5 {
		t.Errorf("ordinary data: %+v", s)
	}
	same := [][]*float64{v(2, 2, 2, 2), v(2, 2, 2, 9)}
	if s := clipToColourRange(same); s.lo != 2 || s.hi != 9 || len(s.mapped) != 0 || *same[1][3] != 9 {
		t.Errorf("equal cells: %+v", s)
	}
	if s := clipToColourRange([][]*float64{{nil}}); s.ok {
		t.Errorf("no cells: %+v", s)
	}
}

// jsNumber prints numbers exactly as JavaScript's String() does; these
// are String()'s outputs.
func TestJSNumber(t *testing.T) {
	for f, want := range map[float64]string{
		0: "0", 1: "1", -2: "-2", 123.456: "123.456", 0.30000000000000004: "0.30000000000000004",
		1e-6: "0.000001", 1e-7: "1e-7", -2.5e-8: "-2.5e-8", 1.5e21: "1.5e+21", 1e20: "100000000000000000000",
		1.2150000012: "1.2150000012", math.Inf(1): "Infinity",
	} {
		if got := jsNumber(f); got != want {
			t.Errorf("jsNumber(%v) = %q, want %q", f, got, want)
		}
	}
}

// TestStepGridEvenlySpaced: Grafana's Heatmap panel sizes every cell and
// spaces its step ticks by the first two columns' distance, so the frame's
// columns must be evenly spaced whatever the server's buckets held.
func TestStepGridEvenlySpaced(t *testing.T) {
	cases := []struct {
		steps []int64
		width int64
		want  []int64
		at    []int
	}{
		// Layer records every 10 steps, one bucket per step.
		{[]int64{10, 20, 30}, 1, []int64{10, 20, 30}, []int{0, 1, 2}},
		// Buckets of 5 whose first steps are 1, 5, 10: bucket starts.
		{[]int64{1, 5, 10, 15}, 5, []int64{0, 5, 10, 15}, []int{0, 1, 2, 3}},
		// An empty bucket becomes an empty column, not a wider gap.
		{[]int64{3, 7, 15}, 4, []int64{0, 4, 8, 12}, []int{0, 1, 3}},
		// Records every 10 steps in buckets of 7: the 7-step grid.
		{[]int64{10, 20, 30, 40}, 7, []int64{7, 14, 21, 28, 35}, []int{0, 1, 3, 4}},
		{nil, 3, []int64{}, []int{}},
	}
	for _, c := range cases {
		xs, at := stepGrid(c.steps, c.width)
		if !slices.Equal(xs, c.want) || !slices.Equal(at, c.at) {
			t.Errorf("steps %v width %d: grid %v at %v, want %v at %v", c.steps, c.width, xs, at, c.want, c.at)
		}
		for k := 2; k < len(xs); k++ {
			if xs[k]-xs[k-1] != xs[1]-xs[0] {
				t.Errorf("steps %v: grid %v not evenly spaced", c.steps, xs)
			}
		}
	}
}

// A run whose hook said its layers cannot be timed (a model compiled
// whole) gets no cells and the hook's sentence as the frame's notice,
// which Grafana shows in the panel's header.
func TestHeatmapOfCompiledRunSaysWhy(t *testing.T) {
	base := startServer(t)
	ingest(t, base, []map[string]any{
		{"kind": "run", "run_id": "compiled", "project": "p", "started_at": ts(0),
			"meta": map[string]any{"layer_times": "unavailable: the model is compiled whole (torch.compile), so its layers run inside one graph"}},
		{"kind": "step", "run_id": "compiled", "rank": 0, "step": 1, "time": ts(time.Second), "step_ms": 30},
	})
	tp := startPlugin(t)
	req := &backend.QueryDataRequest{PluginContext: pluginContext("compiled", base, readToken), Queries: []backend.DataQuery{{RefID: "A",
		JSON:      json.RawMessage(`{"queryType":"heatmap","runId":"compiled","pass":"forward","maxSteps":60}`),
		TimeRange: backend.TimeRange{From: time.Now().Add(-time.Hour), To: time.Now()}}}}
	resp, err := tp.Client.QueryData(context.Background(), req)
	if err != nil || resp.Responses["A"].Error != nil {
		t.Fatalf("%v %v", err, resp.Responses["A"].Error)
	}
	f := resp.Responses["A"].Frames[0]
	if n, _ := f.RowLen(); n != 0 || !hasNotice(f, "no per-layer times in this run: the model is compiled whole (torch.compile)") {
		t.Errorf("%d columns, meta %+v; want none and the hook's sentence", n, f.Meta)
	}
}
