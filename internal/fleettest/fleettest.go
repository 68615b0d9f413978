// Package fleettest writes, for tests, the records of a synchronous
// data-parallel run of many ranks as the hook and the collectors would send
// them: every rank arrives at the gradient all-reduce at the end of
// backward after 140 ms and a jitter of up to 4 ms, one rank planted 30 ms
// later, and every rank leaves when the last arrives. The records are
// NDJSON-ready maps, for a test's POST /api/v1/ingest.
package fleettest

import (
	"fmt"
	"time"
)

// RanksPerHost is how many ranks (one GPU each) share a node.
const RanksPerHost = 8

// LateMS is how much later than the others the planted straggler arrives.
const LateMS = 30.0

// stepPeriod is the wall-clock time from one step to the next.
const stepPeriod = 200 * time.Millisecond

// Run describes one run.
type Run struct {
	ID    string
	Ranks int
	Steps int
	Late  int // the straggler's rank; -1 for none
	Start time.Time
}

// Host is the node of a rank.
func (r Run) Host(rank int) string { return fmt.Sprintf("%s-node-%d", r.ID, rank/RanksPerHost) }

// Records are the run's records: the run, a step record of every rank
// and step (step, comm, data and wait times, arrival at the all-reduce,
// GPU utilisation and memory), then one GPU sample of each rank from its
// node's collector, which tells the server the ranks' hosts.
func (r Run) Records() []map[string]any {
	at := func(d time.Duration) string { return r.Start.Add(d).UTC().Format(time.RFC3339Nano) }
	recs := []map[string]any{{"kind": "run", "run_id": r.ID, "project": "fleet", "started_at": at(0),
		"meta": map[string]any{"world_size": r.Ranks}}}
	arrive := make([]float64, r.Ranks)
	for step := range r.Steps {
		start := time.Duration(step) * stepPeriod
		last := 0.0
		for k := range arrive {
			arrive[k] = 140 + float64((step*31+k*17)%100)/25
			if k == r.Late {
				arrive[k] += LateMS
			}
			last = max(last, arrive[k])
		}
		for k := range r.Ranks {
			util := 97.0
			if k == r.Late {
				util = 80
			}
			recs = append(recs, map[string]any{
				"kind": "step", "run_id": r.ID, "rank": k, "step": step, "time": at(start + 180*time.Millisecond),
				"step_ms": last + 25, "comm_ms": 5, "data_ms": 1.5, "gpu_util_pct": util, "gpu_mem_used_gb": 60,
				"sync_ns": r.Start.Add(start).UnixNano() + int64(arrive[k]*1e6), "sync_wait_ms": last - arrive[k] + 0.2,
			})
		}
	}
	for k := range r.Ranks {
		recs = append(recs, map[string]any{
			"kind": "gpu", "time": at(time.Second), "host": r.Host(k), "gpu": k % RanksPerHost,
			"uuid": fmt.Sprintf("GPU-%s-%d", r.ID, k), "name": "H100", "run_id": r.ID, "rank": k,
			"util_pct": 95, "mem_used_bytes": 60e9, "mem_total_bytes": 80e9,
		})
	}
	return recs
}
