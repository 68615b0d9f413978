package ingest_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/ingest"
)

// Many ranks of one run post small batches at once, and each re-sends one
// of its batches: every answer counts that request's own records, accepted
// or duplicate, and every step is stored once, whether the server wrote a
// batch alone or together with others.
func TestIngestManySmallBatchesAtOnce(t *testing.T) {
	s := newServer(t, ingest.Options{})
	const ranks, batches, per, retried = 48, 12, 5, 3
	body := func(rank, b int) []byte {
		var lines []string
		for i := 0; i < per; i++ {
			step := b*per + i
			lines = append(lines, fmt.Sprintf(`{"kind":"step","run_id":"many","rank":%d,"step":%d,"time":%d,"loss":%d.25}`, rank, step, 1000+step, step))
		}
		return []byte(strings.Join(lines, "\n"))
	}
	post := func(b []byte) (api.IngestResult, error) {
		resp, err := http.Post(s.URL+"/api/v1/ingest", "application/x-ndjson", bytes.NewReader(b))
		if err != nil {
			return api.IngestResult{}, err
		}
		defer resp.Body.Close()
		msg, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return api.IngestResult{}, fmt.Errorf("status %d: %s", resp.StatusCode, msg)
		}
		var res api.IngestResult
		return res, json.Unmarshal(msg, &res)
	}
	errs := make(chan error, ranks*(batches+1))
	var wg sync.WaitGroup
	for r := 0; r < ranks; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := 0; b < batches; b++ {
				res, err := post(body(r, b))
				if err != nil {
					errs <- err
					return
				}
				if res.Accepted != per || res.Duplicates != 0 {
					errs <- fmt.Errorf("rank %d batch %d: %d accepted, %d duplicates; want %d new", r, b, res.Accepted, res.Duplicates, per)
				}
				if b == retried {
					res, err := post(body(r, b))
					if err != nil {
						errs <- err
						return
					}
					if res.Accepted != 0 || res.Duplicates != per {
						errs <- fmt.Errorf("rank %d resent batch %d: %d accepted, %d duplicates; want %d duplicates", r, b, res.Accepted, res.Duplicates, per)
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := s.count(t, `SELECT count(*) FROM steps WHERE run_id = 'many'`); n != ranks*batches*per {
		t.Fatalf("%d steps stored, want %d", n, ranks*batches*per)
	}
	if n := s.count(t, `SELECT count(*) FROM (SELECT 1 FROM steps GROUP BY run_id, rank, step HAVING count(*) > 1) d`); n != 0 {
		t.Fatalf("%d steps stored twice", n)
	}
	logCombined(t, s)
	if n := s.count(t, `SELECT count(*) FROM rollup_dirty WHERE run_id = 'many'`); n != ranks {
		t.Fatalf("%d rollup markers, want one per rank's block (%d)", n, ranks)
	}
}

// logCombined logs the combiner's counters: how many batches shared a
// transaction, and how many combined writes were redone batch by batch.
func logCombined(t *testing.T, s *server) {
	for _, l := range strings.Split(s.metricsText(t), "\n") {
		if strings.HasPrefix(l, "deepseed_ingest_combine") {
			t.Log(l)
		}
	}
}

// One body of 50,000 ranks, as many as --max-batch-rows lets it hold, and
// the same as a JSON array: each is stored (200), not refused for want of
// the database's lock slots, and sent again is all duplicates.
func TestIngestBodyOfFiftyThousandRanks(t *testing.T) {
	s := newServer(t, ingest.Options{})
	const ranks = 50000
	lines := make([]string, ranks)
	for r := range lines {
		lines[r] = fmt.Sprintf(`{"kind":"step","run_id":"r%d","rank":%d,"step":0,"time":1000,"loss":1.5}`, r%3, r)
	}
	if res := s.ingest(t, lines...).result(t); res.Accepted != ranks || res.Duplicates != 0 {
		t.Fatalf("%d accepted, %d duplicates; want %d new", res.Accepted, res.Duplicates, ranks)
	}
	array := []byte("[" + strings.Join(lines, ",") + "]")
	if res := s.post(t, "/api/v1/ingest", array, "Content-Type", "application/json").result(t); res.Accepted != 0 || res.Duplicates != ranks {
		t.Fatalf("sent again: %d accepted, %d duplicates; want %d duplicates", res.Accepted, res.Duplicates, ranks)
	}
	if n := s.count(t, `SELECT count(*) FROM steps`); n != ranks {
		t.Fatalf("%d steps stored, want %d", n, ranks)
	}
}
