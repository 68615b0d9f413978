package ingest

import (
	"context"
	"errors"
	"sync"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// combiner writes small batches that arrive together in one transaction.
//
// When every rank of a large run posts its own few records a second, the
// database spends more on each transaction (its locks, its round trips,
// its commit) than on the rows. A batch of new steps, layers and
// evaluations waits here while the combiner's writers are busy; a writer
// that comes free takes every batch waiting, up to a bound, and writes them
// as one with store.WriteBatchNew. Nothing waits while a writer is free, so
// a lightly loaded server writes each batch at once, as before.
//
// A combined write that fails, or that finds a key already stored (a retry,
// a resumed run), is undone and each of its batches is written on its own
// through store.WriteBatch, so that every batch keeps its own answer: its
// own duplicates, its own 400, its own 503.
type combiner struct {
	st *store.Store
	m  *metrics

	mu      sync.Mutex
	pending []*combined
	writers int // goroutines running run
}

// combined is one request's batch waiting in the combiner.
type combined struct {
	ctx  context.Context
	recs []api.Record
	keys []int64 // the locks its records take (store.LockKeys)
	done chan combineResult
}

type combineResult struct {
	res store.WriteResult
	err error
}

const (
	// combineWriters is how many combined writes run at once; the pool has
	// at least 8 connections and the query service needs some.
	combineWriters = 4
	// A batch larger than combineMaxBatch is written on its own: it
	// already pays for its transaction.
	combineMaxBatch = 200
	// combineMaxRecords and combineMaxBatches bound one combined write;
	// each batch's ranks are advisory locks held to its end, and a group
	// takes no more than store.MaxBatchLocks of them: past that it would
	// be a wide batch, which writes beside no other.
	combineMaxRecords = 5000
	combineMaxBatches = 256
)

func newCombiner(st *store.Store, m *metrics) *combiner {
	return &combiner{st: st, m: m}
}

// combinable reports whether a batch may share a transaction: a small one
// of runs, steps, layers and evaluations only.
func combinable(recs []api.Record) bool {
	if len(recs) == 0 || len(recs) > combineMaxBatch {
		return false
	}
	for _, r := range recs {
		if r.Run == nil && r.Step == nil && r.Layers == nil && r.Eval == nil {
			return false
		}
	}
	return true
}

// write stores recs, alone or with the batches waiting beside it.
func (c *combiner) write(ctx context.Context, recs []api.Record) (store.WriteResult, error) {
	if !combinable(recs) {
		return c.st.WriteBatch(ctx, recs)
	}
	me := &combined{ctx: ctx, recs: recs, keys: store.LockKeys(recs), done: make(chan combineResult, 1)}
	c.mu.Lock()
	c.pending = append(c.pending, me)
	if c.writers < combineWriters {
		c.writers++
		go c.run()
	}
	c.mu.Unlock()
	select {
	case r := <-me.done:
		return r.res, r.err
	case <-ctx.Done():
		// A writer may still store it; the sender's retry is then a
		// duplicate, which is harmless.
		return store.WriteResult{}, ctx.Err()
	}
}

// run writes waiting batches until none is left. Writers start with the
// batches that find fewer than combineWriters at work, and end when they
// find nothing waiting, so an idle server keeps none.
func (c *combiner) run() {
	for {
		group := c.take()
		if group == nil {
			return
		}
		c.writeGroup(group)
	}
}

// take removes the next group of waiting batches, skipping those whose
// senders have gone. With nothing left it retires the calling writer, under
// the same lock that queues batches, and returns nil.
func (c *combiner) take() []*combined {
	c.mu.Lock()
	defer c.mu.Unlock()
	var group []*combined
	locks := map[int64]struct{}{}
	n, i := 0, 0
	for ; i < len(c.pending) && len(group) < combineMaxBatches; i++ {
		p := c.pending[i]
		if p.ctx.Err() != nil {
			continue
		}
		if len(group) > 0 && (n+len(p.recs) > combineMaxRecords || len(locks)+newKeys(locks, p.keys) > store.MaxBatchLocks) {
			break
		}
		group = append(group, p)
		n += len(p.recs)
		for _, k := range p.keys {
			locks[k] = struct{}{}
		}
	}
	c.pending = append(c.pending[:0], c.pending[i:]...)
	if len(group) == 0 && len(c.pending) == 0 {
		c.writers--
		return nil
	}
	return group
}

// newKeys counts the keys not in set.
func newKeys(set map[int64]struct{}, keys []int64) int {
	n := 0
	for _, k := range keys {
		if _, ok := set[k]; !ok {
			n++
		}
	}
	return n
}

func (c *combiner) writeGroup(group []*combined) {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	if len(group) > 1 {
		var all []api.Record
		for _, g := range group {
			all = append(all, g.recs...)
		}
		_, err := c.st.WriteBatchNew(ctx, all)
		if err == nil {
			c.m.combinedBatches.Add(len(group))
			for _, g := range group {
				g.done <- combineResult{res: allAccepted(g.recs)}
			}
			return
		}
		if !errors.Is(err, store.ErrNotDirect) {
			c.m.combineFallbacks.Inc()
		}
	}
	for _, g := range group {
		res, err := c.st.WriteBatch(g.ctx, g.recs)
		g.done <- combineResult{res, err}
	}
}

// allAccepted is the result of a batch whose records were all new.
func allAccepted(recs []api.Record) store.WriteResult {
	res := store.WriteResult{Accepted: len(recs), ByKind: map[string]int{}}
	for _, r := range recs {
		res.ByKind[r.Kind()]++
	}
	return res
}
