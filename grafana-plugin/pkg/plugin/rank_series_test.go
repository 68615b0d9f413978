package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
	"github.com/grafana/grafana-plugin-sdk-go/experimental"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/server/servertest"
	"github.com/deepseed/deepseed/store/storetest"
)

// syncRecords is run "sync-3": three ranks of equal 100 ms steps, rank 1
// arriving 20 ms late at the end of backward from step 11 on; every rank
// leaves the collective 2 ms after the last arrival. The steps start at
// start: the alert evaluator scores only runs seen within a day, so the
// record times are recent and the frames use none of them (the step is
// x); the arrivals, on the ranks' own clock, start at t0, so lateness is
// the same float arithmetic on every run of the test.
func syncRecords(start time.Time) []map[string]any {
	at := func(d time.Duration) string { return start.Add(d).UTC().Format(time.RFC3339Nano) }
	recs := []map[string]any{{"kind": "run", "run_id": "sync-3", "project": "nlp", "started_at": at(0)}}
	for step := 1; step <= 20; step++ {
		last := 0.0
		if step >= 11 {
			last = 20
		}
		for rank := range 3 {
			late := 0.0
			if rank == 1 {
				late = last
			}
			d := time.Duration(step) * 100 * time.Millisecond
			recs = append(recs, map[string]any{
				"kind": "step", "run_id": "sync-3", "rank": rank, "step": step, "time": at(d), "loss": 2.0, "step_ms": 100,
				"sync_ns": t0.Add(d).UnixNano() + int64(late*1e6), "sync_wait_ms": last + 2 - late,
			})
		}
	}
	return recs
}

// The lateness and straggler score of each rank come to a trend panel as
// one frame per rank with the step as x; the score is a ratio shown in
// percent, the lateness in ms.
func TestQueryDataRankSeries(t *testing.T) {
	cfg := server.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.IngestTokens = []string{ingestToken}
	cfg.ReadTokens = []string{readToken}
	cfg.AlertsEvery = 100 * time.Millisecond
	base := servertest.Start(t, cfg, storetest.NewStore(t))
	ingest(t, base, syncRecords(time.Now().Add(-time.Minute).Truncate(time.Second)))
	// The alert evaluator scores the ranks on its next pass.
	deadline := time.Now().Add(3 * time.Minute)
	for !scoredTo(t, base, "sync-3", 20, 3) {
		if time.Now().After(deadline) {
			t.Fatal("no straggler scores up to step 20")
		}
		time.Sleep(100 * time.Millisecond)
	}

	tp := startPlugin(t)
	req := &backend.QueryDataRequest{PluginContext: pluginContext("rank-series", base, readToken)}
	// Four points downsample the twenty steps: buckets keep min and max.
	cases := []struct {
		name, query string
		points      int64
	}{
		{"series_rank_scores", `{"queryType":"series","runId":"sync-3","metrics":["straggler_score","lateness_ms"],"rank":"all","xAxis":"step"}`, 1000},
		{"series_rank_lateness_minmax", `{"queryType":"series","runId":"sync-3","metrics":["lateness_ms"],"rank":"1","xAxis":"step","minMax":true}`, 4},
	}
	for _, c := range cases {
		req.Queries = append(req.Queries, backend.DataQuery{RefID: c.name, JSON: json.RawMessage(c.query), MaxDataPoints: c.points,
			TimeRange: backend.TimeRange{From: t0.Add(-time.Hour), To: t0.Add(time.Hour)}})
	}
	resp, err := tp.Client.QueryData(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dr := resp.Responses[c.name]
			if dr.Error != nil {
				t.Fatalf("query failed: %v", dr.Error)
			}
			experimental.CheckGoldenJSONResponse(t, "testdata", c.name+".golden", &dr, *update)
		})
	}

	// Beside the golden file: six frames (two metrics × three ranks),
	// each Step then the value; rank 1's score climbs from step 11 and
	// ends above the alert's 10 %, the others' stay 0.
	fr := resp.Responses["series_rank_scores"].Frames
	if len(fr) != 6 {
		t.Fatalf("%d frames, want 6", len(fr))
	}
	for _, f := range fr {
		if len(f.Fields) != 2 || f.Fields[0].Name != "step" || f.Fields[0].Config.DisplayNameFromDS != "Step" || f.Rows() != 20 {
			t.Fatalf("frame %s: want step and a value over 20 steps", frameSummary(f))
		}
		v := f.Fields[1]
		rank := v.Labels["rank"]
		switch v.Name {
		case "straggler_score":
			if v.Config.Unit != "percentunit" {
				t.Errorf("score unit %q", v.Config.Unit)
			}
			end := v.At(19).(float64)
			if before := v.At(9).(float64); before != 0 || (rank == "1") != (end > 0.1) || (rank != "1" && end != 0) {
				t.Errorf("rank %s score: %v at step 10, %v at step 20", rank, before, end)
			}
		case "lateness_ms":
			if want := map[bool]float64{true: 20, false: 0}[rank == "1"]; math.Abs(v.At(19).(float64)-want) > 1e-3 || v.Config.Unit != "ms" {
				t.Errorf("rank %s lateness at step 20: %v %s, want %v ms", rank, v.At(19), v.Config.Unit, want)
			}
		default:
			t.Errorf("unexpected field %s", v.Name)
		}
	}
}

// scoredTo reports whether every one of n ranks of run has a straggler
// score at step.
func scoredTo(t *testing.T, base, run string, step int64, n int) bool {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/api/v1/runs/%s/series?metric=straggler_score&rank=all", base, run), nil)
	req.Header.Set("Authorization", "Bearer "+readToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var sr api.SeriesResponse
	if res.StatusCode != http.StatusOK || json.Unmarshal(b, &sr) != nil {
		t.Fatalf("series: %d %s", res.StatusCode, b)
	}
	done := 0
	for _, s := range sr.Series {
		if len(s.Points) > 0 && s.Points[len(s.Points)-1].Step == step {
			done++
		}
	}
	return done == n
}
