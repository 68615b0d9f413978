package store

import (
	"hash/fnv"
	"sort"
	"strconv"

	"github.com/deepseed/deepseed/api"
)

// Concurrency of a batch's writes. Every batch holds a shared lock on each
// run it writes to, which dropping a run (retention, DeleteRuns) takes
// exclusively, so a run is never dropped under a batch that writes to it.
// Keys are deduplicated per run and rank
// (per run and split for evaluations), so that is what a batch locks: an
// advisory lock per (run, rank) it brings steps or layers for, per (run,
// split) it brings evaluations for, and per run it brings events without
// a time for. The ranks of one run write in parallel; two batches of the
// same rank (a retry racing its original, a resumed run) wait for each
// other, so the probe for stored keys and the merge see each other's rows.
// Growing a run's layer names takes one more lock per run (layerLockKey),
// only in the batch that grows them, after the others.
//
// The runs row is written at the end of the transaction: run and end
// records, and last_seen_at and started_at when a record moves them,
// last_seen_at by a second or more, so that a steady stream of batches of a
// live run does not queue on its row.
//
// Every lock a transaction holds takes a slot of PostgreSQL's shared lock
// table (max_locks_per_transaction times max_connections, 6,400 by
// default), and a batch may name up to --max-batch-rows runs or ranks: one
// that held a lock for each would fill the table ("out of shared memory")
// and fail every time it is retried, along with whatever else wanted a
// lock meanwhile. So a batch that needs more than maxBatchLocks locks is a
// wide batch: it takes wideBatchLock alone, exclusively, in place of all
// of them. Every other batch holds wideBatchLock shared, first, so a wide
// batch waits for the batches in flight and they for it: whatever a wide
// batch writes, no batch writes beside it. Whoever takes a run's or a
// host's lock exclusively (dropping a run, closing GPU minutes) holds
// wideBatchLock shared first too, since a wide batch takes no lock of its
// own runs and hosts. Taking wideBatchLock before any other lock keeps
// the order of every transaction the same, so none waits in a cycle.
const maxBatchLocks = 512

var wideBatchLock = lockKey("wide-batch")

// lockKey hashes the parts of a lock's name into PostgreSQL's advisory
// lock space. A collision makes two batches wait for each other, nothing
// worse.
func lockKey(parts ...string) int64 {
	h := fnv.New64a()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return int64(h.Sum64())
}

func runLockKey(run string) int64 { return lockKey(run, "run") }

// gpuHostLockKey is the lock of a host's GPU minute rollups: batches of
// its GPU samples hold it shared, and the closing of its minutes
// (samples_gpu_close.go) exclusively.
func gpuHostLockKey(host string) int64 { return lockKey(host, "gpu-minutes") }

// runLockKeys returns the shared locks of the batch, sorted: its runs',
// and the GPU minute locks of the hosts it brings GPU samples of.
func (b *batchPlan) runLockKeys() []int64 {
	keys := make([]int64, 0, len(b.runIDs))
	for _, id := range b.runIDs {
		keys = append(keys, runLockKey(id))
	}
	hosts := map[string]bool{}
	for _, g := range b.gpus {
		if !hosts[g.Host] {
			hosts[g.Host] = true
			keys = append(keys, gpuHostLockKey(g.Host))
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	return keys
}

func rankLockKey(run string, rank int) int64 { return lockKey(run, "rank", strconv.Itoa(rank)) }
func splitLockKey(run, split string) int64   { return lockKey(run, "split", split) }
func eventLockKey(run string) int64          { return lockKey(run, "events") }

// wide reports whether the batch takes wideBatchLock alone (see above):
// shared and exclusive are its runLockKeys and lockKeys.
func wideBatch(shared, exclusive []int64) bool { return len(shared)+len(exclusive) > maxBatchLocks }

// lockKeys returns the advisory locks the batch takes, sorted and unique.
func (b *batchPlan) lockKeys() []int64 {
	set := map[int64]struct{}{}
	for _, s := range b.steps {
		set[rankLockKey(s.RunID, s.Rank)] = struct{}{}
	}
	for _, l := range b.layers {
		set[rankLockKey(l.RunID, l.Rank)] = struct{}{}
	}
	for _, e := range b.evals {
		set[splitLockKey(e.RunID, orDefault(e.Split, "val"))] = struct{}{}
	}
	for _, e := range b.untimed {
		set[eventLockKey(e.RunID)] = struct{}{}
	}
	keys := make([]int64, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	return keys
}

// MaxBatchLocks is the most locks a batch takes one by one; past it, it
// takes wideBatchLock alone and writes beside no other batch. Ingest
// combines batches up to it (LockKeys).
const MaxBatchLocks = maxBatchLocks

// LockKeys returns the locks WriteBatch takes for a batch of run, step,
// layers and evaluation records, the kinds ingest combines into one
// transaction, in no order: the keys of runLockKeys and lockKeys of the
// plan of recs; records of other kinds add none.
func LockKeys(recs []api.Record) []int64 {
	b := &batchPlan{}
	runs := map[string]bool{}
	for _, r := range recs {
		switch {
		case r.Run != nil:
			runs[r.Run.RunID] = true
		case r.Step != nil:
			runs[r.Step.RunID] = true
			b.steps = append(b.steps, r.Step)
		case r.Layers != nil:
			runs[r.Layers.RunID] = true
			b.layers = append(b.layers, r.Layers)
		case r.Eval != nil:
			runs[r.Eval.RunID] = true
			b.evals = append(b.evals, r.Eval)
		}
	}
	for id := range runs {
		b.runIDs = append(b.runIDs, id)
	}
	return append(b.runLockKeys(), b.lockKeys()...)
}
