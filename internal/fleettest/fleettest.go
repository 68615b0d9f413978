// Package fleettest writes the records of a synchronous data-parallel run
// of many ranks as the hook and the collectors would send them: every
// rank arrives at the gradient all-reduce at the end of backward after
// 140 ms and a spread of up to 4 ms, one rank planted 30 ms later, and
// every rank leaves when the last arrives (see [Arrivals]). It comes in
// five shapes: [Run], the few figures the fleet tests read, as
// NDJSON-ready maps for a test's POST /api/v1/ingest; [Bench], the
// training figures, layers, evaluations and GPU samples the query
// benchmark loads; [Load], the seed-shaped run without an all-reduce
// that the ingest benchmark posts; [GenRun], the seeded noisy run of
// the store's compression tests and reports, as NDJSON lines; and
// [DemoRun], the runs deepseed demo writes (see [DemoRuns]): a BERT run
// and pythia runs that reproduce the experiment report's tables, with
// their nodes' GPU and host samples.
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
	for step := range r.Steps {
		start := time.Duration(step) * stepPeriod
		arrive, last := Arrivals(int64(step), r.Ranks, r.Late)
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

// Spread is a deterministic spread of a rank's figures by step, 0 to
// 3.96 (milliseconds, where it is a time).
func Spread(step int64, rank int) float64 { return float64(spread(step, rank)) / 25 }

// spread is the pattern of [Spread]: 0 to 99 by step and rank.
func spread(step int64, rank int) int { return (int(step)*31 + rank*17) % 100 }

// Arrivals returns when each of ranks reaches the all-reduce of step, in
// milliseconds after the step began: 140 ms of work plus [Spread], the
// late rank (-1: none) LateMS later; and the last arrival, when every
// rank leaves.
func Arrivals(step int64, ranks, late int) (arrive []float64, last float64) {
	return allReduce(ranks, func(k int) float64 {
		if k == late {
			return 140 + Spread(step, k) + LateMS
		}
		return 140 + Spread(step, k)
	})
}

// allReduce returns when each of ranks reaches an all-reduce, at(rank),
// and the last arrival, when every rank leaves it: a rank waits from its
// arrival to the last.
func allReduce(ranks int, at func(rank int) float64) (arrive []float64, last float64) {
	arrive = make([]float64, ranks)
	for k := range arrive {
		arrive[k] = at(k)
		last = max(last, arrive[k])
	}
	return arrive, last
}
