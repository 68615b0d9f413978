package collector

import (
	"sort"
	"sync"

	"github.com/deepseed/deepseed/api"
)

// announced is a training process that said who it is through the hook.
type announced struct {
	PID       int64
	RunID     string
	Rank      int
	LocalRank int
}

// registry maps announced PIDs to their run and rank. GPU samples whose
// process list holds such a PID are attributed to that run.
type registry struct {
	mu sync.Mutex
	m  map[int64]announced
	// gen counts changes to the set, so that the GPU sampler reads the
	// GPUs' process lists again when a training process arrives or leaves.
	gen uint64
}

func newRegistry() *registry { return &registry{m: map[int64]announced{}} }

func (r *registry) announce(p *api.Process) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := announced{PID: p.PID, RunID: p.RunID, Rank: p.Rank, LocalRank: p.LocalRank}
	if old, ok := r.m[p.PID]; !ok || old != a {
		r.gen++
	}
	r.m[p.PID] = a
}

// generation changes whenever a process is announced, re-announced as
// another run or rank, or forgotten.
func (r *registry) generation() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gen
}

func (r *registry) lookup(pid int64) (announced, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.m[pid]
	return a, ok
}

// list returns the announced processes ordered by PID.
func (r *registry) list() []announced {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]announced, 0, len(r.m))
	for _, a := range r.m {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out
}

// forget drops a process that has exited.
func (r *registry) forget(pid int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[pid]; ok {
		r.gen++
	}
	delete(r.m, pid)
}
