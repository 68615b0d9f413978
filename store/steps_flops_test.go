package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// TFLOP/s and MFU reach their columns on every write path (the inline
// insert of a small batch, COPY of a large one, the merge of a replaced
// step) and the run's rollups.
func TestWriteBatchStoresTFLOPSAndMFU(t *testing.T) {
	s := storetest.NewStore(t)
	ctx := context.Background()
	// Small batch: inline insert.
	mustWrite(t, s, `{"kind":"step","run_id":"small","rank":0,"step":1,"time":"2025-01-01T00:00:01Z","tflops":100.5,"mfu":0.25}`)
	// Large batch: COPY.
	var big []string
	for i := 0; i < 200; i++ {
		big = append(big, fmt.Sprintf(`{"kind":"step","run_id":"big","rank":0,"step":%d,"time":"2025-01-01T00:00:01Z","tflops":%d,"mfu":%g}`, i, 100+i%3, 0.1*float64(1+i%3)))
	}
	mustWrite(t, s, big...)
	// Replacing a stored step: the merge keeps the new values.
	mustWrite(t, s, `{"kind":"step","run_id":"small","rank":0,"step":1,"time":"2025-01-01T00:00:02Z","tflops":200,"mfu":0.5}`)

	var smallTF, smallMFU, bigTF, bigMFU float64
	err := storetest.Pool(t, s).QueryRow(ctx, `SELECT (SELECT tflops FROM steps WHERE run_id = 'small'), (SELECT mfu FROM steps WHERE run_id = 'small'),
		(SELECT avg(tflops) FROM steps WHERE run_id = 'big'), (SELECT avg(mfu) FROM steps WHERE run_id = 'big')`).Scan(&smallTF, &smallMFU, &bigTF, &bigMFU)
	if err != nil {
		t.Fatal(err)
	}
	if smallTF != 200 || smallMFU != 0.5 {
		t.Fatalf("replaced step: tflops %v mfu %v, want 200, 0.5", smallTF, smallMFU)
	}
	// 67 steps of 100, 67 of 101, 66 of 102 (i%3 over 0..199).
	wantTF := (67*100.0 + 67*101 + 66*102) / 200
	wantMFU := (67*0.1 + 67*0.2 + 66*0.30000000000000004) / 200
	if d := bigTF - wantTF; d > 1e-9 || d < -1e-9 {
		t.Fatalf("copied steps: mean tflops %v, want %v", bigTF, wantTF)
	}
	if d := bigMFU - wantMFU; d > 1e-9 || d < -1e-9 {
		t.Fatalf("copied steps: mean mfu %v, want %v", bigMFU, wantMFU)
	}

	if !store.IsStepMetric("tflops") || !store.IsStepMetric("mfu") {
		t.Fatal("tflops and mfu are not step metrics")
	}
	if _, err := s.RefreshRollups(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	st, err := s.RunStats(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	if st.MeanTFLOPS == nil || st.MeanMFU == nil {
		t.Fatalf("run stats: mean tflops %v, mean mfu %v", st.MeanTFLOPS, st.MeanMFU)
	}
	if d := *st.MeanTFLOPS - wantTF; d > 1e-9 || d < -1e-9 {
		t.Fatalf("run stats: mean tflops %v, want %v", *st.MeanTFLOPS, wantTF)
	}
	if d := *st.MeanMFU - wantMFU; d > 1e-9 || d < -1e-9 {
		t.Fatalf("run stats: mean mfu %v, want %v", *st.MeanMFU, wantMFU)
	}
}
