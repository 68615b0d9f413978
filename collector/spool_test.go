package collector

import (
	"fmt"
	"strings"
	"testing"
)

func mkBatch(seq uint64, n int) *batch {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, `{"kind":"event","run_id":"r","type":"note","text":"%d-%d"}`+"\n", seq, i)
	}
	return &batch{Seq: seq, N: n, Body: []byte(b.String())}
}

// TestSpoolBoundDropsOldest: past its bound the spool drops the oldest
// batches, counts their records, and keeps the rest in order across a
// reopen.
func TestSpoolBoundDropsOldest(t *testing.T) {
	dir := t.TempDir()
	size := int64(len(mkBatch(1, 10).Body))
	dropped := 0
	sp, err := openSpool(dir, 3*size, func(n int) { dropped += n })
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 5; seq++ {
		if err := sp.add(mkBatch(seq, 10)); err != nil {
			t.Fatal(err)
		}
	}
	if dropped != 20 {
		t.Errorf("dropped %d records, want 20 (batches 1 and 2)", dropped)
	}
	if sp.size() > 3*size || sp.len() != 3 {
		t.Errorf("spool holds %d batches, %d bytes; want 3 batches within %d bytes", sp.len(), sp.size(), 3*size)
	}

	again, err := openSpool(dir, 3*size, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := again.nextSeq(); got != 6 {
		t.Errorf("next sequence after reopen %d, want 6", got)
	}
	for _, want := range []uint64{3, 4, 5} {
		b := again.oldest()
		if b == nil || b.Seq != want || string(b.Body) != string(mkBatch(want, 10).Body) {
			t.Fatalf("oldest after reopen: %+v, want batch %d", b, want)
		}
		again.remove(b.Seq)
	}
	if b := again.oldest(); b != nil {
		t.Errorf("spool not empty: batch %d", b.Seq)
	}
}

// TestQueueKeepsOrder: batches spilled to disk while the server is away
// come out before newer ones, in sequence order.
func TestQueueKeepsOrder(t *testing.T) {
	sp, err := openSpool(t.TempDir(), 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	q := newQueue(sp, 2, nil)
	q.push(mkBatch(1, 1))
	q.push(mkBatch(2, 1))
	q.spill() // a send failed
	q.push(mkBatch(3, 1))
	q.push(mkBatch(4, 1)) // memory would be full anyway
	q.push(mkBatch(5, 1))
	for want := uint64(1); want <= 5; want++ {
		b := q.next()
		if b == nil || b.Seq != want {
			t.Fatalf("next: %+v, want batch %d", b, want)
		}
		q.done(b)
	}
	if b := q.next(); b != nil {
		t.Errorf("queue not empty: batch %d", b.Seq)
	}
}
