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

// TestSpoolBoundDropsOldestSamples: past its bound the spool drops the
// oldest sampled batches, counts their records, and keeps the rest in
// order across a reopen.
func TestSpoolBoundDropsOldestSamples(t *testing.T) {
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
	if n, s := again.counts(); n != 30 || s != 30 {
		t.Errorf("after reopen: %d records, %d of them sampled; want 30 and 30", n, s)
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

// TestSpoolNeverDropsAcknowledged: a full spool makes room for the hook's
// records by dropping sampled batches, oldest first; once only the hook's
// acknowledged batches are left, a hook batch is refused and a sampled one
// dropped, and every acknowledged batch is still there after a reopen.
func TestSpoolNeverDropsAcknowledged(t *testing.T) {
	dir := t.TempDir()
	size := int64(len(mkBatch(1, 1).Body))
	dropped := 0
	sp, err := openSpool(dir, 4*size, func(n int) { dropped += n })
	if err != nil {
		t.Fatal(err)
	}
	q := newQueue(sp, func(b *batch, err error) {
		if err != errSpoolFull {
			t.Errorf("sample batch %d: %v, want errSpoolFull", b.Seq, err)
		}
		dropped += b.N
	})
	for seq := uint64(1); seq <= 4; seq++ {
		if seq%2 == 0 {
			q.push(mkBatch(seq, 1))
		} else if err := q.pushFitting(mkBatch(seq, 1)); err != nil {
			t.Fatal(err)
		}
	}
	for _, seq := range []uint64{5, 6} {
		if err := q.pushFitting(mkBatch(seq, 1)); err != nil {
			t.Fatalf("hook batch %d with sampled batches to drop: %v", seq, err)
		}
	}
	if dropped != 2 {
		t.Errorf("%d sampled records dropped, want 2 (batches 2 and 4)", dropped)
	}
	if err := q.pushFitting(mkBatch(7, 1)); err != errSpoolFull {
		t.Fatalf("hook batch past a spool of acknowledged batches: %v, want errSpoolFull", err)
	}
	q.push(mkBatch(8, 1))
	if dropped != 3 {
		t.Errorf("%d sampled records dropped, want 3 (the last one not written)", dropped)
	}
	again, err := openSpool(dir, 4*size, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for b := again.oldest(); b != nil; b = again.oldest() {
		got = append(got, b.Seq)
		again.remove(b.Seq)
	}
	if fmt.Sprint(got) != "[1 3 5 6]" {
		t.Errorf("batches kept %v, want the acknowledged [1 3 5 6]", got)
	}
}

// TestQueueSendsTogetherInOrder: the oldest batches come out together,
// in sequence order, up to the bounds of one send (at least one batch
// whatever its size); batches handed back come out again, and settled ones
// never.
func TestQueueSendsTogetherInOrder(t *testing.T) {
	sp, err := openSpool(t.TempDir(), 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	q := newQueue(sp, nil)
	for seq := uint64(1); seq <= 6; seq++ {
		if seq%2 == 0 {
			q.push(mkBatch(seq, 2))
		} else if err := q.pushFitting(mkBatch(seq, 2)); err != nil {
			t.Fatal(err)
		}
	}
	size := len(mkBatch(1, 2).Body)
	b, seqs := q.next(1, 100, nil)
	if b == nil || fmt.Sprint(seqs) != "[1]" || string(b.Body) != string(mkBatch(1, 2).Body) {
		t.Fatalf("a send smaller than one batch: %v, want batch 1 alone", seqs)
	}
	q.retry(seqs)
	b, seqs = q.next(3*size, 100, nil)
	want := string(mkBatch(1, 2).Body) + string(mkBatch(2, 2).Body) + string(mkBatch(3, 2).Body)
	if fmt.Sprint(seqs) != "[1 2 3]" || b.N != 6 || string(b.Body) != want {
		t.Fatalf("send by bytes: batches %v, %d records; want [1 2 3] and 6", seqs, b.N)
	}
	q.done(seqs)
	b, seqs = q.next(1<<20, 5, nil)
	if fmt.Sprint(seqs) != "[4 5]" || b.N != 4 {
		t.Fatalf("send by records: batches %v, want [4 5]", seqs)
	}
	q.done(seqs)
	if b, seqs = q.next(1<<20, 100, nil); fmt.Sprint(seqs) != "[6]" {
		t.Fatalf("last send: %v, want [6]", seqs)
	}
	q.done(seqs)
	if b, _ := q.next(1<<20, 100, nil); b != nil {
		t.Errorf("queue not empty: batch %d", b.Seq)
	}
	if n, s := sp.counts(); n != 0 || s != 0 || sp.size() != 0 {
		t.Errorf("empty spool counts %d records (%d sampled), %d bytes", n, s, sp.size())
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
	if err := os.WriteFile(filepath.Join(dir, spoolName(3, 3, false)+".tmp"), half[:len(half)/2], 0o640); err != nil {
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
	if _, err := os.Stat(filepath.Join(dir, spoolName(3, 3, false)+".tmp")); !os.IsNotExist(err) {
		t.Fatalf("the crash's temporary file is still there: %v", err)
	}
}
