package ingest

import (
	"sync"
	"time"

	"github.com/deepseed/deepseed/store"
)

// failingFor is how long a failed write keeps the server not ready when
// no write follows it. Senders retry well within it (the collector every
// few seconds); past it, with nothing to go by, the server says it is
// ready again, so that a balancer that stops sending to a server that is
// not ready cannot keep it not ready for ever.
const failingFor = 30 * time.Second

// writeHealth remembers whether the database refuses writes for a reason
// that passes: disk full, read-only, too many connections (see
// store.IsUnavailable).
type writeHealth struct {
	mu  sync.Mutex
	err error // the last write's failure; nil once a write succeeds
	at  time.Time
	now func() time.Time // time.Now unless a test sets it
}

func (w *writeHealth) clock() time.Time {
	if w.now != nil {
		return w.now()
	}
	return time.Now()
}

// note records a write's outcome: a success clears a failure, a failure
// that passes sets it, any other error (the batch's own) says nothing
// about the database.
func (w *writeHealth) note(err error) {
	if err != nil && !store.IsUnavailable(err) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.err, w.at = err, w.clock()
}

// WritesFailing returns why the last write failed when it failed for a
// reason that passes, less than 30 s ago, and no write has succeeded
// since; nil otherwise. The server's /readyz answers 503 meanwhile.
func (h *Handler) WritesFailing() error {
	h.health.mu.Lock()
	defer h.health.mu.Unlock()
	if h.health.err == nil || h.health.clock().Sub(h.health.at) > failingFor {
		return nil
	}
	return h.health.err
}
