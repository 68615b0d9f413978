package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// gpuBatch is batch b of a host's 8 GPUs over minutes minutes from t0:
// one sample of each GPU a minute, at second b of the minute.
func gpuBatch(host string, t0 time.Time, minutes, b int) []string {
	var lines []string
	for m := 0; m < minutes; m++ {
		at := t0.Add(time.Duration(m)*time.Minute + time.Duration(b)*time.Second).Format(time.RFC3339Nano)
		for g := 0; g < 8; g++ {
			lines = append(lines, fmt.Sprintf(`{"kind":"gpu","time":%q,"host":%q,"gpu":%d,"run_id":"r","rank":%d,"util_pct":%d,"power_w":%d.5}`,
				at, host, g, g, (m*7+b*3+g)%101, 200+(m+b)%50))
		}
	}
	return lines
}

// closeAll closes every GPU minute there is to close.
func closeAll(t *testing.T, s *store.Store) {
	t.Helper()
	for more := true; more; {
		var err error
		if _, more, err = s.CloseGPUMinutes(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// rowsMatchingSamples counts the minute rows that hold exactly what their
// minute's samples give, and all the minute rows.
func rowsMatchingSamples(t *testing.T, s *store.Store) (match, rows int) {
	t.Helper()
	err := storetest.Pool(t, s).QueryRow(context.Background(), `
		SELECT count(*) FILTER (WHERE m.samples = r.n AND m.util_pct_n = r.n AND m.util_pct_sum = r.us AND m.util_pct_min = r.ulo
		                          AND m.util_pct_max = r.uhi AND m.power_w_sum = r.ps AND m.last_time = r.last),
		       count(*)
		FROM gpu_device_minutes m LEFT JOIN (
			SELECT host, gpu, date_trunc('minute', time) AS minute, count(*) AS n, sum(util_pct) AS us, min(util_pct) AS ulo,
			       max(util_pct) AS uhi, sum(power_w) AS ps, max(time) AS last
			FROM gpu_samples GROUP BY 1, 2, 3) r USING (host, gpu, minute)`).Scan(&match, &rows)
	if err != nil {
		t.Fatal(err)
	}
	return match, rows
}

// A GPU's minute rows are not written while its minutes are open, however
// many batches bring their samples; closing writes each once, holding
// exactly its samples, up to the GPU's newest minute; a sample that comes
// after is added to its row.
func TestGPUMinutesWrittenOnceClosed(t *testing.T) {
	s := storetest.NewStore(t)
	ctx := context.Background()
	pool := storetest.Pool(t, s)
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	for b := 0; b < 30; b++ {
		mustWrite(t, s, gpuBatch("h0", t0, 120, b)...)
	}
	var rows, marks int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM gpu_device_minutes), (SELECT count(*) FROM gpu_minute_marks WHERE closed_until = $1)`, t0).
		Scan(&rows, &marks); err != nil {
		t.Fatal(err)
	}
	if rows != 0 || marks != 8 {
		t.Fatalf("after 30 batches of open minutes: %d minute rows, %d GPUs marked at their first minute; want 0 and 8", rows, marks)
	}
	closeAll(t, s)
	// Every minute but each GPU's newest, open until a later one comes.
	if match, rows := rowsMatchingSamples(t, s); rows != 8*119 || match != rows {
		t.Fatalf("closed: %d minute rows, %d of them what their samples give; want %d", rows, match, 8*119)
	}
	// A late sample of a closed minute.
	mustWrite(t, s, `{"kind":"gpu","time":"2026-03-01T10:05:45Z","host":"h0","gpu":0,"run_id":"r","rank":0,"util_pct":100,"power_w":999}`)
	if match, rows := rowsMatchingSamples(t, s); rows != 8*119 || match != rows {
		t.Fatalf("a late sample: %d minute rows, %d of them what their samples give; want %d", rows, match, 8*119)
	}
	// A sample of a later minute closes the one before it.
	mustWrite(t, s, `{"kind":"gpu","time":"2026-03-01T12:00:10Z","host":"h0","gpu":0,"run_id":"r","rank":0,"util_pct":1,"power_w":1}`)
	closeAll(t, s)
	if match, rows := rowsMatchingSamples(t, s); rows != 8*119+1 || match != rows {
		t.Fatalf("a later minute: %d minute rows, %d of them what their samples give; want %d", rows, match, 8*119+1)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT samples FROM gpu_device_minutes WHERE host = 'h0' AND gpu = 0 AND minute = '2026-03-01T10:05:00Z'`).Scan(&n); err != nil || n != 31 {
		t.Fatalf("the late sample's minute holds %d samples (%v), want 31", n, err)
	}
}

// Batches of a host's samples racing the closing of its minutes leave
// every minute row holding exactly its samples: none counted twice, none
// lost between a batch and the closing that did not see it.
func TestGPUMinutesClosedWhileWritten(t *testing.T) {
	s := storetest.NewStore(t)
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	batches := make([][]api.Record, 45)
	for b := range batches {
		batches[b] = mustDecode(t, gpuBatch("h0", t0, 20, b)...)
	}
	done := make(chan struct{})
	var closer sync.WaitGroup
	closer.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, _, err := s.CloseGPUMinutes(context.Background()); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var writers sync.WaitGroup
	for w := 0; w < 3; w++ {
		writers.Go(func() {
			for b := w; b < 45; b += 3 {
				if _, err := s.WriteBatch(context.Background(), batches[b]); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	writers.Wait()
	close(done)
	closer.Wait()
	closeAll(t, s)
	if match, rows := rowsMatchingSamples(t, s); rows != 8*19 || match != rows {
		t.Fatalf("%d minute rows, %d of them what their samples give; want %d", rows, match, 8*19)
	}
}
