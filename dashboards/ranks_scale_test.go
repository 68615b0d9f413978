package dashboards_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/dashboards"
	"github.com/deepseed/deepseed/grafana-plugin/pkg/plugin"
	"github.com/deepseed/deepseed/internal/fleettest"
	"github.com/deepseed/deepseed/server/servertest"
)

// TestRanksDashboardPastSixteenRanks runs every panel of the Ranks
// dashboard through the plugin on a run of more than api.MaxRankSeries
// ranks, one of them planted late, and checks what the user would see:
// each per-rank chart gets the band its overrides fill and the lines of the
// top ranks (the straggler's among the lateness lines), and the Hosts
// table names the straggler's node first.
func TestRanksDashboardPastSixteenRanks(t *testing.T) {
	const straggler = 13
	base, readToken, ingestToken := startServer(t)
	start := time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)
	// A thousand ranks, as the dashboard is meant for; 200 steps give the
	// band two buckets.
	run := fleettest.Run{ID: "fleet-1024", Ranks: 1024, Steps: 200, Late: straggler, Start: start}
	servertest.Ingest(t, base, ingestToken, run.Records())
	servertest.WaitRollups(t, base, readToken, run.ID)

	ctx := context.Background()
	inst, err := plugin.NewDatasource(ctx, backend.DataSourceInstanceSettings{
		UID: dashboards.DatasourceUID, Name: "DeepSeed",
		JSONData:                []byte(fmt.Sprintf(`{"url":%q}`, base)),
		DecryptedSecureJSONData: map[string]string{"token": readToken},
	})
	if err != nil {
		t.Fatal(err)
	}
	ds := inst.(*plugin.Datasource)
	raw, err := os.ReadFile(filepath.Join(jsonDir, dashboards.UIDRanks+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc fullDashboard
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	timeRange := backend.TimeRange{From: start.Add(-time.Hour), To: start.Add(time.Hour)}
	vars, _ := pickVariables(ctx, t, ds, doc, timeRange)
	if vars["run"] != run.ID {
		t.Fatalf("run picked: %q, want %q", vars["run"], run.ID)
	}
	// Alerts come from the detectors' evaluator, which takes up a run
	// received in the last hour on its next pass, whenever its steps ran:
	// the panel may or may not have them yet. Straggler scores it has not
	// stored are computed on read.
	maybeBlank := []string{"Open alerts"}
	bands := 0
	for _, p := range doc.Panels {
		if p.Type == "row" {
			continue
		}
		t.Run(p.Title, func(t *testing.T) {
			frames, err := runPanel(ctx, ds, p, vars, timeRange)
			if slices.Contains(maybeBlank, p.Title) {
				if err != nil && !errors.Is(err, errBlank) {
					t.Fatal(err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkPanelFields(t, p, frames)
			checkStepFrames(t, p, frames)
			if band := bandFields(t, p); len(band) > 0 {
				bands++
				if !hasBand(t, p, frames) {
					t.Fatalf("no band among %v", fieldNames(frames))
				}
				var ranks []string
				for _, f := range frames[1:] {
					for _, fl := range f.Fields {
						if r, ok := fl.Labels["rank"]; ok {
							ranks = append(ranks, r)
						}
					}
				}
				if len(ranks) != 3 || (p.Title == "Lateness per rank" && !slices.Contains(ranks, fmt.Sprint(straggler))) {
					t.Errorf("lines of ranks %v beside the band: want the top 3 (the lateness chart's with rank %d)", ranks, straggler)
				}
				if n := frames[0].Meta; n == nil || len(n.Notices) == 0 || !strings.Contains(n.Notices[0].Text, "1024 ranks") {
					t.Errorf("band frame meta %+v: want the notice naming the 1024 ranks", n)
				}
				// A run of 200 steps is drawn step by step, to its last
				// step, not as the stored spread's two 100-step buckets
				// (the score from the first step it has, past its warm-up).
				if x := frames[0].Fields[0]; p.Type == "trend" {
					last, _ := x.FloatAt(x.Len() - 1)
					if int(last) != run.Steps-1 || x.Len() < run.Steps/2 || (p.Title != "Straggler score per rank" && x.Len() != run.Steps) {
						t.Errorf("band of %d points to step %v: want one a step to step %d", x.Len(), last, run.Steps-1)
					}
				}
				if p.Title == "Straggler score per rank" && !slices.Contains(ranks, fmt.Sprint(straggler)) {
					t.Errorf("score lines of ranks %v: want the straggler %d's", ranks, straggler)
				}
			}
			// The NVML samples of 1,024 GPUs come as their distribution,
			// not as a line per GPU.
			if nvml := map[string]string{"GPU utilisation per rank": "util_pct", "GPU memory per rank": "mem_used_bytes"}[p.Title]; nvml != "" {
				if !slices.Contains(fieldNames(frames), api.SpreadLabel(nvml, api.SpreadMedian)) || len(frames) > 8 {
					t.Errorf("%d frames %v: want the distribution of the GPUs' %s beside the steps' band", len(frames), fieldNames(frames), nvml)
				}
			}
			// A bar chart of 1,024 ranks draws api.MaxRankBars bars, the
			// straggler's first.
			if p.Type == "barchart" {
				if n := frames[0].Rows(); n != api.MaxRankBars {
					t.Errorf("%d bars, want %d", n, api.MaxRankBars)
				}
				if p.Title != "Wait on slower ranks" && p.Title != "Wait in the collective per rank" {
					for _, f := range frames[0].Fields {
						if f.Name == "rank_name" && f.At(0) != fmt.Sprintf("rank %d", straggler) {
							t.Errorf("first bar %v, want the straggler's", f.At(0))
						}
					}
				}
			}
			if p.Title == "Hosts" {
				if host, _ := frames[0].Fields[0].ConcreteAt(0); host != run.Host(straggler) {
					t.Errorf("first host %v, want the straggler's %s", host, run.Host(straggler))
				}
			}
		})
	}
	if bands != 8 {
		t.Errorf("%d panels drew a band, want the 5 step charts with data, the straggler score and the 2 GPU charts", bands)
	}
}

// bandFields are the fields of the ranks' distribution a panel's rank=all
// series queries get on a run of more than api.MaxRankSeries ranks.
func bandFields(t *testing.T, p fullPanel) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, raw := range p.Targets {
		var q dashboards.Query
		if err := json.Unmarshal(raw, &q); err != nil {
			t.Fatalf("target %s: %v", raw, err)
		}
		if (q.QueryType != api.QuerySeries && q.QueryType != api.QueryGPUs) || q.Rank != "all" {
			continue
		}
		for _, m := range q.Metrics {
			for _, quantile := range api.SpreadQuantiles {
				out[api.SpreadLabel(m, quantile)] = true
			}
		}
	}
	return out
}

// hasBand reports whether the frames hold a distribution over the ranks:
// a run of up to api.MaxRankSeries ranks has none, and the band's
// overrides then match nothing, as they should.
func hasBand(t *testing.T, p fullPanel, frames data.Frames) bool {
	t.Helper()
	band := bandFields(t, p)
	return slices.ContainsFunc(fieldNames(frames), func(n string) bool { return band[n] })
}
