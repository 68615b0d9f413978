package plugin

import (
	"context"
	"encoding/json"
	"github.com/deepseed/deepseed/api"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/server/servertest"
)

const corpusRanks, corpusSteps = 4, 240

// corpusRun is one run of a small planted-cause corpus, as the server's
// regression corpus builds them: 4 ranks on two hosts (0–1 on n1, 2–3 on
// n2), steps of about 100 ms with phases and layers every step, a GPU
// sample a second a GPU, every rank waiting in the collective for the
// slowest. dataRank, when not -1, has a slow input pipeline (30 ms more
// data loading a step); noise offsets the whole run's compute.
func corpusRun(id string, start time.Time, torch string, dataRank int, noise float64, seed int) []map[string]any {
	layers := []string{"embed", "blocks.0", "blocks.1", "head"}
	at := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	recs := []map[string]any{{"kind": "run", "run_id": id, "project": "corpus", "started_at": at(start),
		"meta": map[string]any{"model": "gpt-corpus", "params": 125000000, "world_size": corpusRanks, "precision": "bf16",
			"parallelism": "data", "micro_batch": 8, "git_commit": "abc123",
			"versions": map[string]string{"torch": torch, "cuda": "12.4"}}}}
	jit := func(step, rank, k int) float64 {
		x := math.Sin(float64(step*7919+rank*104729+k*1299709+seed*15485863)) * 43758.5453
		return (1 + 0.02*(x-math.Floor(x)-0.5)) * (1 + noise)
	}
	t := start
	for step := 1; step <= corpusSteps; step++ {
		var fwd, bwd [corpusRanks][]float64
		var own [corpusRanks][4]float64 // data, forward, backward, optimizer
		busiest := 0.0
		for rank := range corpusRanks {
			for li := range layers {
				fwd[rank] = append(fwd[rank], 6*jit(step, rank, li))
				bwd[rank] = append(bwd[rank], 12*jit(step, rank, li+50))
				own[rank][1] += fwd[rank][li]
				own[rank][2] += bwd[rank][li]
			}
			own[rank][0], own[rank][3] = 5*jit(step, rank, 90), 10*jit(step, rank, 91)
			if rank == dataRank {
				own[rank][0] += 30
			}
			busiest = max(busiest, own[rank][0]+own[rank][1]+own[rank][2]+own[rank][3])
		}
		stepMS := busiest + 8
		t = t.Add(time.Duration(stepMS * float64(time.Millisecond)))
		for rank := range corpusRanks {
			o := own[rank]
			recs = append(recs,
				map[string]any{"kind": "step", "run_id": id, "rank": rank, "step": step, "time": at(t), "step_ms": stepMS,
					"data_ms": o[0], "forward_ms": o[1], "backward_ms": o[2], "optimizer_ms": o[3],
					"sync_wait_ms": busiest - (o[0] + o[1] + o[2] + o[3]) + 8, "throughput_sps": 8000 / stepMS,
					"mfu": 40 / stepMS, "gpu_mem_used_gb": 30.0, "loss": 2.0},
				map[string]any{"kind": "layers", "run_id": id, "rank": rank, "step": step, "time": at(t),
					"names": layers, "forward_ms": fwd[rank], "backward_ms": bwd[rank]})
		}
	}
	for s := start; s.Before(t); s = s.Add(time.Second) {
		for rank := range corpusRanks {
			host := "n1"
			if rank >= 2 {
				host = "n2"
			}
			recs = append(recs, map[string]any{"kind": "gpu", "time": at(s), "host": host, "gpu": rank % 2, "run_id": id,
				"rank": rank, "util_pct": 95, "sm_clock_mhz": 1980})
		}
	}
	return append(recs, map[string]any{"kind": "end", "run_id": id, "time": at(t), "status": "finished"})
}

// corpusServer is a server holding three baseline runs of one
// fingerprint and, after them, "slow": a data straggler on rank 2 with a
// newer torch.
func corpusServer(t *testing.T) string {
	t.Helper()
	base := startServer(t)
	for i, r := range []struct {
		id, torch string
		dataRank  int
		noise     float64
	}{{"base-1", "2.3.0", -1, 0}, {"base-2", "2.3.0", -1, 0.004}, {"base-3", "2.3.0", -1, -0.003}, {"slow", "2.4.0", 2, 0}} {
		ingest(t, base, corpusRun(r.id, t0.Add(time.Duration(i)*10*time.Minute), r.torch, r.dataRank, r.noise, i))
	}
	// The ledger and the regression views read the runs' rollups, which
	// the refresher fills beside ingest: wait until it has.
	for _, id := range []string{"base-1", "base-2", "base-3", "slow"} {
		servertest.WaitRollups(t, base, readToken, id)
	}
	return base
}

// framesOf runs one query through the plugin, on the data source
// instance uid (one per server: the harness keeps instances by UID), and
// returns its frames.
func framesOf(t *testing.T, uid, base, query string) data.Frames {
	t.Helper()
	tp := startPlugin(t)
	resp, err := tp.Client.QueryData(context.Background(), &backend.QueryDataRequest{
		PluginContext: pluginContext(uid, base, readToken),
		Queries:       []backend.DataQuery{{RefID: "A", JSON: json.RawMessage(query), TimeRange: backend.TimeRange{From: t0, To: t0.Add(time.Hour)}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.Responses["A"]
	if r.Error != nil {
		t.Fatalf("%s: %v", query, r.Error)
	}
	return r.Frames
}

// column is the values of the field shown as display, numbers as float64.
func column(t *testing.T, f *data.Frame, display string) []any {
	t.Helper()
	for _, fd := range f.Fields {
		if fd.Config != nil && fd.Config.DisplayNameFromDS == display {
			out := make([]any, fd.Len())
			for i := range out {
				out[i] = fd.At(i)
				if p, ok := out[i].(*float64); ok && p != nil {
					out[i] = *p
				}
			}
			return out
		}
	}
	t.Fatalf("frame %q: no column %q", f.Name, display)
	return nil
}

// The What changed panel of the data straggler reads the server's
// sentence first, then the figures, where (rank 2 on n2) and what
// differs (the newer torch), each a frame of the table's frame picker;
// the first run of the fingerprint says why there is no baseline, its
// figures have no baseline mean and its places frame keeps its columns
// with no rows.
func TestRegressionFrames(t *testing.T) {
	base := corpusServer(t)
	frames := framesOf(t, "regression", base, `{"queryType":"regression","runId":"slow"}`)
	var names []string
	for _, f := range frames {
		names = append(names, f.Name)
	}
	want := []string{api.RegressionSentenceFrame, api.RegressionFiguresFrame, api.RegressionPlacesFrame, api.RegressionDiffersFrame}
	if strings.Join(names, "|") != strings.Join(want, "|") {
		t.Fatalf("frames %v, want %v", names, want)
	}
	s := frames[0]
	if s.Fields[0].Config.DisplayNameFromDS != "What changed" || s.Rows() != 1 {
		t.Fatalf("sentence frame: first column %v, %d rows", s.Fields[0].Config, s.Rows())
	}
	sentence := s.Fields[0].At(0).(string)
	t.Logf("slow: %s", sentence)
	if !strings.Contains(sentence, "slower than it should be") || column(t, s, "Likely cause")[0] != "data" ||
		column(t, s, "Baseline runs")[0] != "base-3, base-2, base-1" || column(t, s, "Baseline")[0] != "the newest comparable runs" {
		t.Errorf("sentence row: %q, cause %v, baseline %v (%v)", sentence, column(t, s, "Likely cause"), column(t, s, "Baseline runs"), column(t, s, "Baseline"))
	}
	figs := frames[1]
	if fig := column(t, figs, "Figure"); len(fig) == 0 || fig[0] != "Step time" {
		t.Errorf("figures: %v, want step time first", fig)
	}
	worse := column(t, figs, "Worse beyond the spread")
	if worse[0] != true {
		t.Errorf("step time not worse beyond the spread: %v", worse)
	}
	where := frames[2]
	kinds, places := column(t, where, "Where"), column(t, where, "Name")
	found := map[string]bool{}
	for i := range kinds {
		found[kinds[i].(string)+" "+places[i].(string)] = true
	}
	if !found["rank rank 2"] || !found["host n2"] {
		t.Errorf("where: %v %v, want rank 2 on host n2", kinds, places)
	}
	differs := frames[3]
	what, key, value := column(t, differs, "What"), column(t, differs, "Key"), column(t, differs, "This run")
	torch := false
	for i := range what {
		torch = torch || (what[i] == "Library version" && key[i] == "torch" && value[i] == "2.4.0")
	}
	if !torch {
		t.Errorf("what differs: %v %v %v, want torch 2.4.0", what, key, value)
	}

	first := framesOf(t, "regression", base, `{"queryType":"regression","runId":"base-1"}`)
	if got := first[0].Fields[0].At(0).(string); !strings.HasPrefix(got, "No regression computed: no comparable run") {
		t.Errorf("first run: %q", got)
	}
	for _, m := range column(t, first[1], "Baseline mean") {
		if p, ok := m.(*float64); !ok || p != nil {
			t.Errorf("first run: a baseline mean %v without a baseline", m)
		}
	}
	if where := first[2]; where.Rows() != 0 || len(where.Fields) == 0 {
		t.Errorf("first run: %d places, %d columns; want none, its columns kept", where.Rows(), len(where.Fields))
	}
	// Pinned baseline runs.
	pinned := framesOf(t, "regression", base, `{"queryType":"regression","runId":"base-3","baseline":"{base-1,base-2}"}`)
	if got := column(t, pinned[0], "Baseline runs")[0]; got != "base-1, base-2" && got != "base-2, base-1" {
		t.Errorf("pinned baseline: %v", got)
	}
	if got := pinned[0].Fields[0].At(0).(string); !strings.HasPrefix(got, "No regression: within the spread of 2 baseline runs") {
		t.Errorf("base-3 against base-1 and base-2: %q", got)
	}
}
