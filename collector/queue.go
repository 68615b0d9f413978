package collector

import (
	"sync"
	"time"
)

// batcher gathers records into batches, cut by record count, bytes or age.
type batcher struct {
	maxRecords int
	maxBytes   int
	maxAge     time.Duration
	out        func(*batch)
	seq        func() uint64
	// started is signalled when a record opens an empty batch, so that
	// the run loop arms one timer for its age instead of polling.
	started chan struct{}

	mu    sync.Mutex
	buf   []byte // from batchBufs; nil while empty
	n     int
	first time.Time
}

// add appends one JSON record (no newline) and cuts a batch when full.
func (b *batcher) add(rec []byte, now time.Time) {
	b.addAll([][]byte{rec}, now)
}

// addAll appends records in order, cutting batches as they fill. The
// batches are handed on outside the lock, in the order they were cut.
func (b *batcher) addAll(recs [][]byte, now time.Time) {
	var cuts []*batch
	b.mu.Lock()
	for _, rec := range recs {
		if b.n == 0 {
			b.first = now
			if b.buf == nil {
				b.buf = getBatchBuf()
			}
			select {
			case b.started <- struct{}{}:
			default:
			}
		}
		b.buf = append(b.buf, rec...)
		b.buf = append(b.buf, '\n')
		b.n++
		if b.n >= b.maxRecords || len(b.buf) >= b.maxBytes {
			cuts = append(cuts, b.cutLocked())
		}
	}
	b.mu.Unlock()
	for _, cut := range cuts {
		b.out(cut)
	}
}

// tick cuts the pending batch when it is older than maxAge, or at once
// when force is set.
func (b *batcher) tick(now time.Time, force bool) {
	b.mu.Lock()
	var cut *batch
	if b.n > 0 && (force || now.Sub(b.first) >= b.maxAge) {
		cut = b.cutLocked()
	}
	b.mu.Unlock()
	if cut != nil {
		b.out(cut)
	}
}

func (b *batcher) cutLocked() *batch {
	// Hand the buffer over rather than copy it; it comes back to
	// batchBufs once the server has the batch.
	bt := &batch{Seq: b.seq(), N: b.n, Body: b.buf, pooled: true}
	b.buf = nil
	b.n = 0
	return bt
}

// batchBufs recycles batch bodies: at a steady rate every batch is about
// the size of the one before, so a body freed after its send is the next
// one's buffer instead of garbage.
var batchBufs = sync.Pool{New: func() any { return new([]byte) }}

func getBatchBuf() []byte {
	return (*batchBufs.Get().(*[]byte))[:0]
}

// release returns b's body for reuse. Only the party that settles a batch
// (acknowledged or dead-lettered) calls it, after the queue has let go of
// the batch; nothing may read b.Body afterwards.
func (b *batch) release() {
	if !b.pooled || cap(b.Body) > 16<<20 {
		return
	}
	body := b.Body[:0]
	b.Body, b.pooled = nil, false
	batchBufs.Put(&body)
}

// deadline is when the pending batch is due by age; ok is false when
// nothing is pending.
func (b *batcher) deadline() (t time.Time, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n == 0 {
		return time.Time{}, false
	}
	return b.first.Add(b.maxAge), true
}

func (b *batcher) pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// queue holds the batches waiting for the server, all of them in the
// spool on disk, in sequence order: a batch is acknowledged to its sender
// only once it is there, and leaves only once the server acknowledged it.
type queue struct {
	spool *spool
	wake  chan struct{}
	// onSpoolErr is told about sample batches that could not be written:
	// errSpoolFull when the hook's records fill the spool.
	onSpoolErr func(*batch, error)
}

func newQueue(sp *spool, onSpoolErr func(*batch, error)) *queue {
	return &queue{spool: sp, wake: make(chan struct{}, 1), onSpoolErr: onSpoolErr}
}

// push writes a batch of the collector's own samples, dropping the oldest
// sampled batches when the spool is over its bound; a batch that cannot be
// written at all is reported and dropped.
func (q *queue) push(b *batch) {
	err := q.spool.add(b)
	b.release()
	if err != nil {
		if q.onSpoolErr != nil {
			q.onSpoolErr(b, err)
		}
		return
	}
	q.signal()
}

// pushFitting writes a batch of records a sender still holds, only if it
// fits: errSpoolFull or a write error tell the sender to send it again.
func (q *queue) pushFitting(b *batch) error {
	if err := q.spool.addFitting(b); err != nil {
		return err
	}
	q.signal()
	return nil
}

func (q *queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// next returns the oldest batches as one, up to maxBytes and maxRecords
// (at least one batch, whatever its size), for one send; nil when there
// are none. buf is reused for the body. Each is settled with done or
// handed back with retry.
func (q *queue) next(maxBytes, maxRecords int, buf []byte) (*batch, []uint64) {
	return q.spool.take(maxBytes, maxRecords, buf)
}

// done removes the batches once the server has them (or they were
// dead-lettered).
func (q *queue) done(seqs []uint64) {
	for _, seq := range seqs {
		q.spool.remove(seq)
	}
}

// retry hands batches whose send failed back, to be sent again.
func (q *queue) retry(seqs []uint64) { q.spool.release(seqs) }
