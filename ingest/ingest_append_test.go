package ingest_test

import (
	"fmt"
	"testing"

	"github.com/deepseed/deepseed/ingest"
)

// A live run's batches bring only new steps; a batch that overlaps stored
// steps on any rank, or repeats one, must still store each step once and
// count the rest as duplicates, whichever way the store writes it.
func TestIngestAppendAndOverlap(t *testing.T) {
	s := newServer(t, ingest.Options{})
	lines := func(rank, from, to int, hour int) []string {
		var out []string
		for st := from; st <= to; st++ {
			ts := fmt.Sprintf("2025-01-01T%02d:00:%02dZ", hour, st)
			out = append(out,
				fmt.Sprintf(`{"kind":"step","run_id":"r","rank":%d,"step":%d,"time":"%s","loss":%d}`, rank, st, ts, hour),
				fmt.Sprintf(`{"kind":"layers","run_id":"r","rank":%d,"step":%d,"time":"%s","names":["a","b"],"forward_ms":[%d,1]}`, rank, st, ts, hour))
		}
		return out
	}
	check := func(what string, res, wantAccepted, wantDups int, gotDups int, steps int) {
		t.Helper()
		if res != wantAccepted || gotDups != wantDups {
			t.Fatalf("%s: %d accepted, %d duplicates; want %d, %d", what, res, gotDups, wantAccepted, wantDups)
		}
		if n := s.count(t, `SELECT count(*) FROM steps`); n != steps {
			t.Fatalf("%s: %d step rows, want %d", what, n, steps)
		}
		if n := s.count(t, `SELECT count(*) FROM layer_times`); n != steps {
			t.Fatalf("%s: %d layer rows, want %d", what, n, steps)
		}
		if n := s.count(t, `SELECT count(*) FROM (SELECT run_id, rank, step FROM steps GROUP BY 1, 2, 3 HAVING count(*) > 1) d`); n != 0 {
			t.Fatalf("%s: %d steps stored twice", what, n)
		}
	}

	res := s.ingest(t, append(lines(0, 1, 5, 0), lines(1, 1, 5, 0)...)...).result(t)
	check("first batch", res.Accepted, 20, res.Duplicates, 0, 10)

	// Rank 0 goes on, rank 1 resends step 5 with its old time: one
	// duplicate step and one duplicate layers record.
	res = s.ingest(t, append(lines(0, 6, 8, 0), lines(1, 5, 7, 0)...)...).result(t)
	check("overlapping batch", res.Accepted, 10, res.Duplicates, 2, 15)

	// Steps 9 and 11 around a stored 10 on rank 0; 10 is not in the batch.
	s.ingest(t, lines(0, 10, 10, 0)...).result(t)
	body := append(lines(0, 9, 9, 0), lines(0, 11, 11, 0)...)
	res = s.ingest(t, body...).result(t)
	check("batch around a stored step", res.Accepted, 4, res.Duplicates, 0, 18)

	// A step repeated inside a batch of new steps: the newer one is kept.
	body = append(lines(2, 1, 2, 1), lines(2, 2, 2, 2)...)
	res = s.ingest(t, body...).result(t)
	check("repeat inside a batch", res.Accepted, 4, res.Duplicates, 2, 20)
	if n := s.count(t, `SELECT loss::int FROM steps WHERE rank = 2 AND step = 2`); n != 2 {
		t.Fatalf("repeated step kept loss %d, want the newer 2", n)
	}
	if n := s.count(t, `SELECT count(*) FROM rollup_dirty WHERE run_id = 'r'`); n != 3 {
		t.Fatalf("rollup_dirty has %d blocks, want one for each of ranks 0, 1 and 2", n)
	}
}
