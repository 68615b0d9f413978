package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// TestTableSizesCountWhatWasWritten writes steps and GPU samples and
// requires the size report to show them in their raw tables, the minute
// sums among the derived ones, and every table it names once.
func TestTableSizesCountWhatWasWritten(t *testing.T) {
	u := storetest.NewDatabase(t)
	s := storetest.Open(t, u, nil)
	s.Timescale = storetest.Mode(t).Timescale
	ctx := context.Background()
	before, err := store.TableSizes(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	var lines []string
	for i := 0; i < 2000; i++ {
		at := t0.Add(time.Duration(i) * time.Second).Format(time.RFC3339Nano)
		lines = append(lines, fmt.Sprintf(`{"kind":"step","run_id":"r","rank":0,"step":%d,"time":%q,"loss":1.5,"step_ms":12.5}`, i, at),
			fmt.Sprintf(`{"kind":"gpu","time":%q,"host":"h0","gpu":0,"run_id":"r","rank":0,"util_pct":50}`, at))
	}
	mustWrite(t, s, `{"kind":"run","run_id":"r","project":"p","started_at":"2026-03-01T10:00:00Z"}`)
	mustWrite(t, s, lines...)
	// The samples' minutes are long over: closing writes their rows.
	if _, _, err := s.CloseGPUMinutes(ctx); err != nil {
		t.Fatal(err)
	}
	after, err := store.TableSizes(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]store.TableSize{}
	for _, ts := range after {
		if _, dup := byName[ts.Name]; dup {
			t.Errorf("%s reported twice", ts.Name)
		}
		byName[ts.Name] = ts
	}
	grown := func(name string) bool {
		for _, b := range before {
			if b.Name == name {
				return byName[name].Bytes > b.Bytes
			}
		}
		return false
	}
	for _, c := range []struct {
		name    string
		derived bool
	}{{"steps", false}, {"gpu_samples", false}, {"gpu_device_minutes", true}, {"gpu_minutes", true}} {
		got, ok := byName[c.name]
		if !ok {
			t.Errorf("%s not reported", c.name)
			continue
		}
		if got.Derived != c.derived {
			t.Errorf("%s derived = %v, want %v", c.name, got.Derived, c.derived)
		}
		if !grown(c.name) {
			t.Errorf("%s did not grow with 2,000 rows written: %+v", c.name, got)
		}
		if got.Hypertable != (s.Timescale && !c.derived) {
			t.Errorf("%s hypertable = %v on a database with TimescaleDB %v", c.name, got.Hypertable, s.Timescale)
		}
	}
}
