package collector

import "sync"

// committer makes the hook's records durable before the receiver answers,
// with group commit: the records of every request that arrives while a
// spool write is under way go into the next spool file together, so a
// burst of requests costs one write and one sync, as Vector's and Fluent
// Bit's disk buffers do. One request at a time leads: it writes the group
// waiting, answers the others, and hands the lead to the first request
// that came in meanwhile, so no request waits for more than the group
// before its own.
type committer struct {
	write func(lines [][]byte) error

	mu      sync.Mutex
	busy    bool
	pending []*commitReq
}

type commitReq struct {
	lines [][]byte
	done  chan commitResult
}

type commitResult struct {
	err  error
	lead bool // the request is to write the next group itself
}

// commit returns once lines are durable, or with the error that kept them
// from being written; then nothing of them was kept.
func (g *committer) commit(lines [][]byte) error {
	r := &commitReq{lines: lines, done: make(chan commitResult, 1)}
	g.mu.Lock()
	g.pending = append(g.pending, r)
	if g.busy {
		g.mu.Unlock()
		res := <-r.done
		if !res.lead {
			return res.err
		}
		g.mu.Lock()
	}
	g.busy = true
	group := g.pending
	g.pending = nil
	g.mu.Unlock()

	var all [][]byte
	for _, q := range group {
		all = append(all, q.lines...)
	}
	err := g.write(all)
	for _, q := range group {
		if q != r {
			q.done <- commitResult{err: err}
		}
	}
	g.mu.Lock()
	if len(g.pending) > 0 {
		next := g.pending[0]
		g.mu.Unlock()
		next.done <- commitResult{lead: true}
	} else {
		g.busy = false
		g.mu.Unlock()
	}
	return err
}
