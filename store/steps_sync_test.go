package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// The synchronisation fields (arrival, collective wait, blocked input
// copy) reach their columns on the inline and the COPY write paths, and
// the two waits roll up like the other step metrics.
func TestWriteBatchStoresSyncFields(t *testing.T) {
	s := storetest.NewStore(t)
	ctx := context.Background()
	const arrival = int64(1735689601123456789)
	mustWrite(t, s, fmt.Sprintf(`{"kind":"step","run_id":"small","rank":2,"step":1,"time":"2025-01-01T00:00:01Z","sync_ns":%d,"sync_wait_ms":12.5,"input_wait_ms":3.25}`, arrival))
	var big []string
	for i := range 200 {
		big = append(big, fmt.Sprintf(`{"kind":"step","run_id":"big","rank":0,"step":%d,"time":"2025-01-01T00:00:01Z","sync_ns":%d,"sync_wait_ms":%d,"input_wait_ms":%d}`,
			i, arrival+int64(i)*1e6, i%4, i%2))
	}
	mustWrite(t, s, big...)

	var ns int64
	var wait, in float64
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT sync_ns, sync_wait_ms, input_wait_ms FROM steps WHERE run_id = 'small'`).Scan(&ns, &wait, &in); err != nil {
		t.Fatal(err)
	}
	if ns != arrival || wait != 12.5 || in != 3.25 {
		t.Fatalf("inline: sync_ns %d sync_wait_ms %v input_wait_ms %v", ns, wait, in)
	}
	var maxNS int64
	var sumWait, sumIn float64
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT max(sync_ns), sum(sync_wait_ms), sum(input_wait_ms) FROM steps WHERE run_id = 'big'`).Scan(&maxNS, &sumWait, &sumIn); err != nil {
		t.Fatal(err)
	}
	var wantWait, wantIn float64
	for i := range 200 {
		wantWait += float64(i % 4)
		wantIn += float64(i % 2)
	}
	if maxNS != arrival+199e6 || sumWait != wantWait || sumIn != wantIn {
		t.Fatalf("copy: max sync_ns %d sum waits %v, %v; want %d, %v, %v", maxNS, sumWait, sumIn, arrival+199e6, wantWait, wantIn)
	}
	if !store.IsStepMetric("sync_wait_ms") || !store.IsStepMetric("input_wait_ms") || store.IsStepMetric("sync_ns") {
		t.Fatal("the waits are step metrics, the arrival clock is not")
	}
}
