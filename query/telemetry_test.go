package query_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// The API document lists exactly the GPU metrics /gpus accepts, so a
// client reading it neither misses one nor sends one in vain.
func TestOpenAPIListsGPUMetrics(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]struct {
			Parameters []struct {
				Name   string `json:"name"`
				Schema struct {
					Items struct {
						Enum []string `json:"enum"`
					} `json:"items"`
				} `json:"schema"`
			} `json:"parameters"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	var enum []string
	for _, p := range doc.Paths["/api/v1/gpus"]["get"].Parameters {
		if p.Name == "metric" {
			enum = slices.Sorted(slices.Values(p.Schema.Items.Enum))
		}
	}
	if want := store.GPUMetrics(); !slices.Equal(enum, want) {
		t.Errorf("api/openapi.json lists GPU metrics %v; /gpus accepts %v", enum, want)
	}
}

// Every documented GPU metric is served; a bucket of throttle reasons
// holds the bits its samples set, not their mean, and the last XID is
// the newest one.
func TestGPUMetricsThrottleReasonsAndXID(t *testing.T) {
	e := newEnv(t)
	// NVML clocks-event reasons: 0x1 idle, then 0x4 SW power cap, then
	// 0x4|0x20 power cap and SW thermal.
	masks := []int64{0x1, 0x1, 0x4, 0x4, 0x24, 0x24}
	xids := []float64{0, 0, 0, 13, 13, 31}
	var recs []api.Record
	for i, m := range masks {
		recs = append(recs, api.Record{GPU: &api.GPU{Kind: "gpu", Time: api.T(t0.Add(time.Duration(i) * 10 * time.Second)), Host: "h",
			GPU: api.Ptr(0), ThrottleReasons: api.Ptr(m), XIDLast: api.F(xids[i]), XIDTotal: api.F(float64(i / 3)),
			UtilPct: api.F(50), ECCCorrected: api.F(1), PCIeTxBps: api.F(1e9), NVLinkTxBps: api.F(2e10), SMActivePct: api.F(80)}})
	}
	// A last sample of utilisation only stretches the span to 59 s, so that
	// three points are buckets of 20 s, one point one of 60 s, both
	// aligned with t0.
	recs = append(recs, api.Record{GPU: &api.GPU{Kind: "gpu", Time: api.T(t0.Add(59 * time.Second)), Host: "h", GPU: api.Ptr(0), UtilPct: api.F(50)}})
	e.write(recs...)
	q := url.Values{"host": {"h"}, "from": {t0.Format(time.RFC3339)}, "to": {t0.Add(time.Hour).Format(time.RFC3339)}}
	for _, m := range store.GPUMetrics() {
		q["metric"] = []string{m}
		e.get("/gpus?"+q.Encode(), 200, nil)
	}

	// Six samples 10 s apart in buckets of 20 s: pairs.
	q["metric"] = []string{"throttle_reasons", "xid_last"}
	q.Set("max_points", "3")
	var res api.GPUResponse
	e.get("/gpus?"+q.Encode(), 200, &res)
	got := map[string][]api.TimePoint{}
	for _, s := range res.Series {
		got[s.Metric] = s.Points
	}
	type p struct{ v, min, max float64 }
	want := map[string][]p{
		"throttle_reasons": {{0x1, 0x1, 0x1}, {0x4, 0x4, 0x4}, {0x24, 0x24, 0x24}},
		"xid_last":         {{0, 0, 0}, {13, 0, 13}, {31, 13, 31}},
	}
	for m, w := range want {
		pts := got[m]
		if len(pts) != len(w) {
			t.Fatalf("%s: %d points %+v, want %d", m, len(pts), pts, len(w))
		}
		for i, wp := range w {
			if g := (p{float64(pts[i].Value), float64(pts[i].Min), float64(pts[i].Max)}); g != wp {
				t.Errorf("%s point %d = %+v, want %+v", m, i, g, wp)
			}
		}
	}

	// One bucket over all six: every bit seen, and the bits all had.
	q.Set("max_points", "1")
	q["metric"] = []string{"throttle_reasons"}
	e.get("/gpus?"+q.Encode(), 200, &res)
	if pts := res.Series[0].Points; len(pts) != 1 || pts[0].Value != 0x25 || pts[0].Min != 0 || pts[0].Max != 0x25 {
		t.Errorf("one bucket of throttle reasons: %+v", pts)
	}
}

// rank picks the GPU of one rank of a run: the Training run dashboard
// charts rank 0's GPU from these samples, whatever the other ranks do.
func TestGPUSeriesOfOneRank(t *testing.T) {
	e := newEnv(t)
	recs := []api.Record{runRec("ddp", nil)}
	for i := range 10 {
		at := api.T(t0.Add(time.Duration(i) * time.Second))
		for g, util := range []float64{85, 27} {
			recs = append(recs, api.Record{GPU: &api.GPU{Kind: "gpu", Time: at, Host: "h", GPU: api.Ptr(g), RunID: "ddp", Rank: api.Ptr(g), UtilPct: api.F(util)}})
		}
	}
	e.write(recs...)
	for rank, want := range []float64{85, 27} {
		var res api.GPUResponse
		e.get(fmt.Sprintf("/gpus?run_id=ddp&metric=util_pct&rank=%d", rank), 200, &res)
		if len(res.Series) != 1 || res.Series[0].GPU != rank {
			t.Fatalf("rank %d: series %+v, want GPU %d alone", rank, res.Series, rank)
		}
		for _, p := range res.Series[0].Points {
			if float64(p.Value) != want {
				t.Errorf("rank %d: point %+v, want %v", rank, p, want)
			}
		}
	}
	var all api.GPUResponse
	e.get("/gpus?run_id=ddp&metric=util_pct", 200, &all)
	if len(all.Series) != 2 {
		t.Errorf("without rank: %d series, want both GPUs", len(all.Series))
	}
	e.get("/gpus?run_id=ddp&rank=-1", 400, nil)
}

// Past 16 GPUs a run's samples come as their distribution over the GPUs,
// one point a time bucket, not as a series per GPU; one rank's GPU is
// still its own series.
func TestGPUSpreadOfManyGPUs(t *testing.T) {
	e := newEnv(t)
	recs := []api.Record{runRec("wide", nil)}
	const gpus = 20
	for g := range gpus {
		for i := range 3 {
			recs = append(recs, api.Record{GPU: &api.GPU{Kind: "gpu", Time: api.T(t0.Add(time.Duration(i) * time.Second)), Host: fmt.Sprintf("h%d", g/8),
				GPU: api.Ptr(g % 8), RunID: "wide", Rank: api.Ptr(g), UtilPct: api.F(float64(g))}})
		}
	}
	e.write(recs...)
	var res api.GPUResponse
	e.get("/gpus?run_id=wide&metric=util_pct&max_points=1", 200, &res)
	if len(res.Series) != 0 || len(res.Spread) != 1 || !strings.Contains(res.Notice, "20 GPUs") {
		t.Fatalf("series %d, spread %+v, notice %q: want the distribution alone", len(res.Series), res.Spread, res.Notice)
	}
	pts := res.Spread[0].Points
	if len(pts) != 1 || pts[0].Min != 0 || pts[0].Max != gpus-1 || pts[0].Median != 9.5 || pts[0].Ranks != gpus {
		t.Errorf("points %+v: want one bucket from 0 to 19, median 9.5, over 20 GPUs", pts)
	}
	var one api.GPUResponse
	e.get("/gpus?run_id=wide&metric=util_pct&rank=13", 200, &one)
	if len(one.Series) != 1 || len(one.Spread) != 0 || one.Series[0].Points[0].Value != 13 {
		t.Errorf("rank 13: series %+v, spread %d", one.Series, len(one.Spread))
	}
}
