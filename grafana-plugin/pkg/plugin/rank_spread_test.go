package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
	"github.com/grafana/grafana-plugin-sdk-go/data"
	"github.com/grafana/grafana-plugin-sdk-go/experimental"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/fleettest"
	"github.com/deepseed/deepseed/server/servertest"
)

// A run of more than api.MaxRankSeries ranks reads on the Ranks dashboard
// as a band (the ranks' distribution) and the lines of the top ranks, the
// straggler among them; its hosts table names the straggler's node first.
// A run of fewer ranks keeps one line per rank.
func TestQueryDataRankSpread(t *testing.T) {
	const straggler = 13
	fleet := fleettest.Run{ID: "fleet-24", Ranks: 24, Steps: 300, Late: straggler, Start: t0}
	base := startServer(t)
	ingest(t, base, fleet.Records())
	ingest(t, base, fleettest.Run{ID: "fleet-8", Ranks: 8, Steps: 300, Late: 5, Start: t0}.Records())
	// Reads answer whatever the rollup backlog: the figures compared
	// below are those of caught-up rollups.
	servertest.WaitRollups(t, base, readToken, fleet.ID)
	servertest.WaitRollups(t, base, readToken, "fleet-8")

	tp := startPlugin(t)
	req := &backend.QueryDataRequest{PluginContext: pluginContext("rank-spread", base, readToken)}
	queries := map[string]string{
		"series_rank_spread": `{"queryType":"series","runId":"fleet-24","metrics":["lateness_ms"],"rank":"all","xAxis":"step"}`,
		"spread_time":        `{"queryType":"series","runId":"fleet-24","metrics":["sync_wait_ms"],"rank":"all","withStep":true}`,
		"small":              `{"queryType":"series","runId":"fleet-8","metrics":["lateness_ms"],"rank":"all","xAxis":"step"}`,
		"ranks_hosts":        `{"queryType":"ranks","runId":"fleet-24","part":"hosts"}`,
		"ranks":              `{"queryType":"ranks","runId":"fleet-24"}`,
	}
	for _, ref := range slices.Sorted(maps.Keys(queries)) {
		req.Queries = append(req.Queries, backend.DataQuery{RefID: ref, JSON: json.RawMessage(queries[ref]), MaxDataPoints: 1000,
			TimeRange: backend.TimeRange{From: t0.Add(-time.Hour), To: t0.Add(time.Hour)}})
	}
	resp, err := tp.Client.QueryData(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	frames := func(t *testing.T, ref string) data.Frames {
		t.Helper()
		dr := resp.Responses[ref]
		if dr.Error != nil {
			t.Fatalf("%s: query failed: %v", ref, dr.Error)
		}
		return dr.Frames
	}

	t.Run("band", func(t *testing.T) {
		dr := resp.Responses["series_rank_spread"]
		experimental.CheckGoldenJSONResponse(t, "testdata", "series_rank_spread.golden", &dr, *update)
		fr := frames(t, "series_rank_spread")
		band := fr[0]
		want := []string{"Step"}
		for _, q := range api.SpreadQuantiles {
			want = append(want, api.SpreadLabel("lateness_ms", q))
		}
		var got []string
		for _, f := range band.Fields {
			got = append(got, f.Config.DisplayNameFromDS)
			if f.Name != "step" && f.Config.Unit != "ms" {
				t.Errorf("%s: unit %q, want ms", f.Name, f.Config.Unit)
			}
		}
		if !slices.Equal(got, want) || band.Rows() == 0 {
			t.Fatalf("band frame %s, %d rows: want fields %v", frameSummary(band), band.Rows(), want)
		}
		if band.Meta == nil || len(band.Meta.Notices) != 1 || band.Meta.Notices[0].Severity != data.NoticeSeverityInfo ||
			band.Meta.Notices[0].Text == "" {
			t.Errorf("band frame meta %+v: want the server's notice, severity info", band.Meta)
		}
		// The lowest never exceeds the median, nor the median the highest;
		// the straggler's 30 ms stand out as the highest.
		lo, mid, hi := band.Fields[1], band.Fields[3], band.Fields[5]
		for i := range band.Rows() {
			l, m, h := lo.At(i).(float64), mid.At(i).(float64), hi.At(i).(float64)
			if l > m || m > h || h < 25 {
				t.Errorf("bucket %d: min %v, median %v, max %v", i, l, m, h)
			}
		}
		var ranks []string
		for _, f := range fr[1:] {
			if len(f.Fields) != 2 || f.Fields[0].Name != "step" {
				t.Fatalf("rank frame %s: want step and a value", frameSummary(f))
			}
			ranks = append(ranks, f.Fields[1].Labels["rank"])
		}
		if len(ranks) != 3 || !slices.Contains(ranks, fmt.Sprint(straggler)) {
			t.Errorf("rank lines %v: want the top 3, rank %d among them", ranks, straggler)
		}
	})

	t.Run("band on time", func(t *testing.T) {
		band := frames(t, "spread_time")[0]
		if len(band.Fields) != 7 || band.Fields[0].Name != "time" || band.Fields[1].Name != "step" ||
			band.Fields[4].Config.DisplayNameFromDS != "Wait in collective, median of ranks" {
			t.Fatalf("band frame %s: want time, step and the five quantiles", frameSummary(band))
		}
	})

	t.Run("few ranks", func(t *testing.T) {
		fr := frames(t, "small")
		if len(fr) != 8 {
			t.Fatalf("%d frames, want one per rank of 8", len(fr))
		}
		for i, f := range fr {
			if f.Meta != nil && len(f.Meta.Notices) > 0 {
				t.Errorf("frame %d has notices %v", i, f.Meta.Notices)
			}
			// The fixture's rank 5 is late: the server flags it, and its
			// series is named so a dashboard can highlight it.
			want := fmt.Sprintf("lateness rank %d", i)
			if i == 5 {
				want += api.StragglerSuffix
			}
			if v := f.Fields[1]; v.Labels["rank"] != fmt.Sprint(i) || v.Config.DisplayNameFromDS != want {
				t.Errorf("frame %d: %s %v", i, v.Config.DisplayNameFromDS, v.Labels)
			}
		}
	})

	t.Run("hosts", func(t *testing.T) {
		fr := frames(t, "ranks_hosts")
		if len(fr) != 1 || fr[0].Rows() != 3 {
			t.Fatalf("hosts: %d frames, want one of 3 rows", len(fr))
		}
		h := fr[0]
		if host := h.Fields[0].At(0).(string); host != fleet.Host(straggler) {
			t.Errorf("slowest host %q, want the straggler's %q", host, fleet.Host(straggler))
		}
		if worst := *h.Fields[3].At(0).(*int64); worst != straggler {
			t.Errorf("worst rank of the slowest host %d, want %d", worst, straggler)
		}
		if late := h.Fields[4]; late.Config.DisplayNameFromDS != "Max lateness" || *late.At(0).(*float64) < 25 {
			t.Errorf("%s of the slowest host: %v", late.Config.DisplayNameFromDS, late.At(0))
		}
	})

	t.Run("ranks", func(t *testing.T) {
		fr := frames(t, "ranks")
		// 24 ranks x 300 steps is past the server's raw budget: the
		// frame says the figures come from rollups.
		if len(fr) != 1 || fr[0].Rows() != 24 || fr[0].Meta.Custom.(map[string]any)["basis"] != "rollups" {
			t.Fatalf("ranks: %d frames, want one of 24 rows from rollups", len(fr))
		}
	})
}

// A bar chart of a thousand ranks gets api.MaxRankBars bars: the flagged
// ranks and the others evenly from the largest figure to the smallest,
// largest first, with a notice; a few ranks get a bar each, sorted.
func TestRankBarsFrame(t *testing.T) {
	busy := func(n int) float64 { return 100 + float64((n*37)%1000)/10 }
	rr := api.RanksResponse{}
	for n := range 1024 {
		s := api.RankStat{Rank: n, BusyMS: ptrFloat(busy(n))}
		if n == 7 || n == 300 {
			s.BusyMS, s.Straggler = ptrFloat(500+float64(n)), true
		}
		rr.Ranks = append(rr.Ranks, s)
	}
	f := rankBarsFrame(rr, "busy_ms")
	if f.Rows() != api.MaxRankBars {
		t.Fatalf("%d bars of 1024 ranks, want %d", f.Rows(), api.MaxRankBars)
	}
	names, figures := f.Fields[1], fieldNamed(t, f, "busy_ms")
	if names.At(0) != "rank 300" || names.At(1) != "rank 7" {
		t.Errorf("first bars %v, %v: want the flagged ranks 300 and 7", names.At(0), names.At(1))
	}
	for i := 1; i < f.Rows(); i++ {
		if *figures.At(i).(*float64) > *figures.At(i - 1).(*float64) {
			t.Fatalf("bar %d larger than bar %d", i, i-1)
		}
	}
	lo, hi := 1e9, 0.0
	for n := range 1024 {
		if n != 7 && n != 300 {
			lo, hi = min(lo, busy(n)), max(hi, busy(n))
		}
	}
	if got := *figures.At(2).(*float64); got != hi {
		t.Errorf("largest of the others %v, want %v", got, hi)
	}
	if got := *figures.At(f.Rows() - 1).(*float64); got != lo {
		t.Errorf("last bar %v, want the smallest %v", got, lo)
	}
	if f.Meta == nil || len(f.Meta.Notices) != 1 || !strings.Contains(f.Meta.Notices[0].Text, "1024 ranks") {
		t.Errorf("meta %+v: want a notice naming the 1024 ranks", f.Meta)
	}

	rr.Ranks = rr.Ranks[:20]
	f = rankBarsFrame(rr, "busy_ms")
	if f.Rows() != 20 || (f.Meta != nil && len(f.Meta.Notices) > 0) {
		t.Fatalf("20 ranks: %d bars, notices %v; want 20 and none", f.Rows(), f.Meta.Notices)
	}
	if f.Fields[1].At(0) != "rank 7" {
		t.Errorf("first of 20 bars %v, want the flagged rank 7", f.Fields[1].At(0))
	}
}

func ptrFloat(v float64) *api.Float { f := api.Float(v); return &f }

func fieldNamed(t *testing.T, f *data.Frame, name string) *data.Field {
	t.Helper()
	for _, fl := range f.Fields {
		if fl.Name == name {
			return fl
		}
	}
	t.Fatalf("no field %s in %s", name, frameSummary(f))
	return nil
}
