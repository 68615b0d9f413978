package httplimit

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"time"
)

// One memory budget per process: what every request together may make it
// hold, whatever each is allowed alone. A request leases bytes of it as
// its body arrives (in chunks, so a silent or trickling client holds what
// it sent, never what it announced), then for decoding the body and for
// the rows it expands to, and gives the lease back with its answer. A
// request that cannot grow its lease within budgetWait is answered 503
// with Retry-After and nothing of it is stored; one request alone always
// fits, however large the budget is against --max-body-bytes.

// DefaultMaxInflightBytes is the process's budget when the configuration
// leaves it: one 32 MiB body and what it decodes to, with room for many
// small ones beside it.
const DefaultMaxInflightBytes = 160 << 20

// Estimates of what a body costs beyond its bytes, for the lease: records
// decoded from JSON take about twice its bytes, and a stored row about a
// kilobyte on its way to the database (measured: a million step rows
// took 880 MB).
const (
	decodeFactor = 2
	RowBytes     = 1 << 10
)

// budgetWait is how long a request waits for room in the budget before
// it is answered 503; budgetRetryAfter is what that answer asks.
const (
	budgetWait       = time.Second
	budgetRetryAfter = 1
)

// leaseChunk is how much of its body a request leases at a time;
// smallBody is what a lease may grow to from the part of the budget kept
// for small requests.
const (
	leaseChunk = 64 << 10
	smallBody  = 1 << 20
)

// budget is the process's: bytes leased and the bound on them. Room
// freed wakes every waiter (free is closed and replaced).
type budget struct {
	mu   sync.Mutex
	max  int64
	used int64
	peak int64 // the most used since the budget was last empty
	free chan struct{}
	// lastFreed is when memory was last given back to the system.
	lastFreed time.Time
}

var inflight = &budget{max: DefaultMaxInflightBytes, free: make(chan struct{})}

// SetMaxInflightBytes sets the process's budget (--max-inflight-bytes).
func SetMaxInflightBytes(n int64) {
	if n <= 0 {
		n = DefaultMaxInflightBytes
	}
	inflight.mu.Lock()
	inflight.max = n
	inflight.mu.Unlock()
}

// SetMemoryLimit sets the Go runtime's soft memory limit to the budget n
// and a margin for the rest of the process, unless GOMEMLIMIT says
// otherwise, so that the garbage collector works harder before the heap
// outgrows the budget rather than after. For a process's main, once.
func SetMemoryLimit(n int64) {
	if os.Getenv("GOMEMLIMIT") == "" && n > 0 {
		debug.SetMemoryLimit(n + memoryMargin)
	}
}

// memoryMargin is what a process needs beside its requests: its caches,
// connection buffers, the database pool, the runtime.
const memoryMargin = 64 << 20

// Lease is one request's part of the budget. It is not safe for
// concurrent use; Release may be called more than once.
type Lease struct {
	held int64
	// prepaid is the part of held leased ahead for what decoding the body
	// takes (readLimited); Grow takes from it first.
	prepaid int64
	// room is the part of held that is for the work done on the body
	// (decoding it, its rows), which Room reuses.
	room    int64
	release func() // the body's buffers
}

// budgetFull is the answer to a request the budget has no room for.
func budgetFull() *Error {
	return &Error{Status: http.StatusServiceUnavailable, RetryAfter: budgetRetryAfter,
		Msg: fmt.Sprintf("too many request bodies in flight (the process holds at most --max-inflight-bytes, %d bytes, for all of them); nothing stored, send it again shortly", inflight.limit())}
}

func (b *budget) limit() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.max
}

// Grow adds n bytes to the lease, waiting up to budgetWait for room; it
// answers 503 when there is none, and 499 when the client went away. A
// lease is never grown past the whole budget, so one request alone fits.
func (l *Lease) Grow(ctx context.Context, n int64) *Error {
	return l.grow(ctx, n, budgetWait)
}

// GrowDecompressing is [Lease.Grow] for a body being decompressed, which
// waits up to gunzipWait: the room it waits for is held by the other
// decompressions (at most a few at once, gunzipSlots), each done within
// its limit moments later, so a decompression that waits briefly finds
// room and ends as it should (a bomb with its 413) instead of a 503.
func (l *Lease) GrowDecompressing(ctx context.Context, n int64) *Error {
	return l.grow(ctx, n, gunzipWait)
}

// gunzipWait is how long a decompressing body waits for room.
const gunzipWait = 10 * time.Second

func (l *Lease) grow(ctx context.Context, n int64, wait time.Duration) *Error {
	if n <= 0 {
		return nil
	}
	if l.prepaid > 0 {
		use := min(l.prepaid, n)
		l.prepaid -= use
		if n -= use; n == 0 {
			return nil
		}
	}
	var timer *time.Timer
	for {
		inflight.mu.Lock()
		// A request past its first smallBody bytes leaves the last eighth
		// of the budget to small ones, so that a burst of large bodies
		// does not keep other clients' posts waiting.
		limit := inflight.max
		if l.held+n > smallBody {
			limit -= inflight.max / 8
		}
		n = min(n, limit-l.held)
		if n <= 0 || inflight.used+n <= limit {
			n = max(n, 0)
			inflight.used += n
			inflight.peak = max(inflight.peak, inflight.used)
			inflight.mu.Unlock()
			l.held += n
			return nil
		}
		free := inflight.free
		inflight.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		}
		select {
		case <-free:
		case <-timer.C:
			return budgetFull()
		case <-ctx.Done():
			return &Error{Status: StatusClientClosedRequest, Msg: "the client closed the request before its body was read"}
		}
	}
}

// Room makes the lease hold at least n bytes, beside the body's, for the
// work done on it: unlike Grow, room once leased is reused, so a body
// decoded a chunk at a time holds what its largest chunk takes, not all
// of them together. It waits and answers as Grow does.
func (l *Lease) Room(ctx context.Context, n int64) *Error {
	if n <= l.room {
		return nil
	}
	if err := l.Grow(ctx, n-l.room); err != nil {
		return err
	}
	l.room = n
	return nil
}

// KeepBody leaves the body's buffers to the garbage collector instead of
// handing them back for reuse at Release: for a caller whose results keep
// parts of the body.
func (l *Lease) KeepBody() {
	if l != nil {
		l.release = nil
	}
}

// Release gives the lease back. When that empties a budget that was more
// than half used, the memory the burst took is handed back to the system
// (at most every few seconds), so that the process does not keep the
// resident size of its busiest moment.
func (l *Lease) Release() {
	if l == nil {
		return
	}
	if l.release != nil {
		l.release()
		l.release = nil
	}
	if l.held == 0 {
		return
	}
	inflight.mu.Lock()
	inflight.used -= l.held
	l.held, l.prepaid, l.room = 0, 0, 0
	close(inflight.free)
	inflight.free = make(chan struct{})
	giveBack := inflight.used == 0 && inflight.peak > inflight.max/2 && time.Since(inflight.lastFreed) > freeEvery
	if inflight.used == 0 {
		inflight.peak = 0
	}
	if giveBack {
		inflight.lastFreed = time.Now()
	}
	inflight.mu.Unlock()
	if giveBack {
		go debug.FreeOSMemory()
	}
}

// freeEvery bounds how often a burst's memory is handed back.
const freeEvery = 5 * time.Second

// InflightBytes reports the bytes leased now and the budget, for
// /metrics and tests.
func InflightBytes() (used, limit int64) {
	inflight.mu.Lock()
	defer inflight.mu.Unlock()
	return inflight.used, inflight.max
}
