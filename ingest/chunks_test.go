package ingest_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/internal/httplimit"
	"github.com/deepseed/deepseed/store/storetest"
)

// largeBody is an NDJSON body large enough to be stored a chunk at a time
// (past 8 MiB), of several chunks (httplimit.StreamChunkBytes and
// StreamChunkRows): a run, steps records of ranks 0 and 1 with a
// kilobyte-sized line each, a steps record of rank 2 whose steps span
// chunks, evaluations, and the run's end. It returns the body and the
// steps it holds.
func largeBody(t *testing.T) ([]string, int) {
	t.Helper()
	var metrics strings.Builder
	for i := range 40 {
		fmt.Fprintf(&metrics, `,"metric_%02d":%d.5`, i, i)
	}
	lines := []string{`{"kind":"run","run_id":"big","project":"p","name":"large"}`}
	steps := 0
	for step := range 6000 {
		for rank := range 2 {
			lines = append(lines, fmt.Sprintf(`{"kind":"step","run_id":"big","rank":%d,"step":%d,"time":%d,"loss":1.5,"metrics":{%s}}`,
				rank, step, 1700000000+step, metrics.String()[1:]))
			steps++
		}
		if step%100 == 0 {
			lines = append(lines, fmt.Sprintf(`{"kind":"eval","run_id":"big","step":%d,"time":%d,"loss":1.2}`, step, 1700000000+step))
		}
	}
	nums := make([]string, 2*httplimit.StreamChunkRows+10)
	for i := range nums {
		nums[i] = fmt.Sprint(i)
	}
	lines = append(lines, `{"kind":"steps","run_id":"big","rank":2,"time":1700000000,"loss":1.5,"step":[`+strings.Join(nums, ",")+`]}`)
	steps += len(nums)
	lines = append(lines, `{"kind":"end","run_id":"big","time":1700009000,"status":"finished"}`)
	if n := len(strings.Join(lines, "\n")); n <= 4*httplimit.StreamChunkBytes {
		t.Fatalf("the body is %d bytes, not one stored a chunk at a time", n)
	}
	return lines, steps
}

// TestIngestLargeBodyInChunks: a body of several chunks is stored whole
// and answered with all its records; sent again, every record of it is a
// duplicate and nothing changes; and no lease is left behind.
func TestIngestLargeBodyInChunks(t *testing.T) {
	s := newServer(t, ingest.Options{})
	lines, steps := largeBody(t)
	res := s.ingest(t, lines...).result(t)
	if res.ByKind["step"] != steps || res.ByKind["eval"] != 60 || res.Duplicates != 0 {
		t.Fatalf("result = %+v, want %d steps and 60 evaluations, none a duplicate", res, steps)
	}
	if n := s.count(t, `SELECT count(*) FROM steps WHERE run_id = 'big'`); n != steps {
		t.Fatalf("stored %d steps, want %d", n, steps)
	}
	if n := s.count(t, `SELECT count(*) FROM runs WHERE run_id = 'big' AND status = 'finished' AND project = 'p'`); n != 1 {
		t.Fatal("the run is not stored finished in its project")
	}
	// Written a chunk at a time: a write per chunk, each within a
	// chunk's rows.
	var writes int
	for _, l := range strings.Split(s.metricsText(t), "\n") {
		if v, ok := strings.CutPrefix(l, "deepseed_db_write_duration_seconds_count "); ok {
			fmt.Sscan(v, &writes)
		}
	}
	if want := steps / httplimit.StreamChunkRows; writes < want {
		t.Fatalf("the body was written in %d writes, want at least %d chunks", writes, want)
	}
	before := s.tables(t)
	again := s.ingest(t, lines...).result(t)
	if again.Duplicates != steps+60 {
		t.Fatalf("the body sent again: %+v, want its %d steps and evaluations as duplicates", again, steps+60)
	}
	if after := s.tables(t); after != before {
		t.Fatalf("the body sent again changed the tables: %s, was %s", after, before)
	}
	if used, _ := httplimit.InflightBytes(); used != 0 {
		t.Fatalf("%d bytes still leased after every answer", used)
	}
}

// TestIngestLargeBodyRefusedWhole: a body of several chunks with a bad
// line, even its last, or past the rows bound, is refused naming the line,
// and nothing of it is stored, not even the chunks before that line.
func TestIngestLargeBodyRefusedWhole(t *testing.T) {
	lines, steps := largeBody(t)
	t.Run("bad last line", func(t *testing.T) {
		s := newServer(t, ingest.Options{})
		bad := append(append([]string{}, lines...), `{"kind":"step","run_id":"big","rank":-1,"step":1}`)
		e := s.ingest(t, bad...).apiError(t, http.StatusBadRequest)
		if e.Record == nil || e.Record.Line != len(bad) || e.Record.Index != len(bad)-1 || e.Record.Field != "rank" {
			t.Fatalf("error = %s (%+v), want line %d's rank", e.Error, e.Record, len(bad))
		}
		if n := s.stored(t); n != 0 {
			t.Fatalf("a refused body stored %d rows", n)
		}
	})
	t.Run("past the rows bound", func(t *testing.T) {
		s := newServer(t, ingest.Options{MaxBatchRows: steps})
		e := s.ingest(t, lines...).apiError(t, http.StatusRequestEntityTooLarge)
		if !strings.Contains(e.Error, fmt.Sprintf("%d rows", steps)) || !strings.Contains(e.Error, "nothing stored") {
			t.Fatalf("413 message %q", e.Error)
		}
		if n := s.stored(t); n != 0 {
			t.Fatalf("a body past the rows bound stored %d rows", n)
		}
	})
	if used, _ := httplimit.InflightBytes(); used != 0 {
		t.Fatalf("%d bytes still leased after every answer", used)
	}
}

// TestIngestLargeBodyDatabaseRefusal: a value the database refuses in a
// later chunk of a large body (a CHECK the validator knows nothing of) is
// the sender's 400 naming its line and saying before which line the body
// was stored; the body sent again without it stores the rest, the chunks
// stored before counting as duplicates.
func TestIngestLargeBodyDatabaseRefusal(t *testing.T) {
	s := newServer(t, ingest.Options{})
	if _, err := storetest.Pool(t, s.Store).Exec(context.Background(), `ALTER TABLE runs ADD CONSTRAINT no_name_42 CHECK (name IS DISTINCT FROM 'forty-two')`); err != nil {
		t.Fatal(err)
	}
	lines, steps := largeBody(t)
	bad := append(append([]string{}, lines[:len(lines)-1]...), `{"kind":"run","run_id":"big","name":"forty-two"}`, lines[len(lines)-1])
	e := s.ingest(t, bad...).apiError(t, http.StatusBadRequest)
	if e.Record == nil || e.Record.Line != len(bad)-1 || e.Record.Index != len(bad)-2 || !strings.Contains(e.Error, "no_name_42") {
		t.Fatalf("error %q, record %+v: want line %d named, with the database's reason", e.Error, e.Record, len(bad)-1)
	}
	var before int
	if _, err := fmt.Sscanf(e.Error[strings.Index(e.Error, "before line "):], "before line %d", &before); err != nil || before <= 1 || before > len(bad)-1 {
		t.Fatalf("error %q does not say before which line the body was stored", e.Error)
	}
	stored := s.count(t, `SELECT count(*) FROM steps WHERE run_id = 'big'`)
	if stored == 0 || stored >= steps {
		t.Fatalf("%d of %d steps stored, want those of the chunks before the refused one", stored, steps)
	}
	res := s.ingest(t, lines...).result(t)
	if res.Duplicates < stored || res.ByKind["step"] != steps-stored {
		t.Fatalf("the body sent again: %+v, want the %d stored steps as duplicates and the other %d stored", res, stored, steps-stored)
	}
	if n := s.count(t, `SELECT count(*) FROM steps WHERE run_id = 'big'`); n != steps {
		t.Fatalf("%d of %d steps stored", n, steps)
	}
}
