package collector

import (
	"fmt"
	"os"
	"path/filepath"
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

// TestQueueKeepsOrder: batches come out in sequence order, whether the
// hook's records or samples, and a batch the bound cannot take is refused
// whole when its sender keeps it.
func TestQueueKeepsOrder(t *testing.T) {
	size := int64(len(mkBatch(1, 1).Body))
	sp, err := openSpool(t.TempDir(), 4*size, nil)
	if err != nil {
		t.Fatal(err)
	}
	q := newQueue(sp, nil)
	for seq := uint64(1); seq <= 4; seq++ {
		if seq%2 == 0 {
			q.push(mkBatch(seq, 1))
		} else if err := q.pushFitting(mkBatch(seq, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.pushFitting(mkBatch(5, 1)); err != errSpoolFull {
		t.Fatalf("a batch past the bound: %v, want errSpoolFull", err)
	}
	for want := uint64(1); want <= 4; want++ {
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

// TestSpoolIgnoresCrashLeftovers: a temporary file left by a crash in the
// middle of a write is removed at the next start, never sent, and the
// batches written before it come out whole and in order.
func TestSpoolIgnoresCrashLeftovers(t *testing.T) {
	dir := t.TempDir()
	sp, err := openSpool(dir, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 2; seq++ {
		if err := sp.addFitting(mkBatch(seq, 3)); err != nil {
			t.Fatal(err)
		}
	}
	half := mkBatch(3, 3).Body
	if err := os.WriteFile(filepath.Join(dir, spoolName(3, 3)+".tmp"), half[:len(half)/2], 0o640); err != nil {
		t.Fatal(err)
	}
	again, err := openSpool(dir, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []uint64{1, 2} {
		b := again.oldest()
		if b == nil || b.Seq != want || string(b.Body) != string(mkBatch(want, 3).Body) {
			t.Fatalf("oldest: %+v, want batch %d whole", b, want)
		}
		again.remove(b.Seq)
	}
	if b := again.oldest(); b != nil {
		t.Fatalf("a half-written batch came back: %q", b.Body)
	}
	if _, err := os.Stat(filepath.Join(dir, spoolName(3, 3)+".tmp")); !os.IsNotExist(err) {
		t.Fatalf("the crash's temporary file is still there: %v", err)
	}
}
