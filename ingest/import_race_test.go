package ingest_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/store/storetest"
)

// TestConcurrentImportsIntoProjectsOneSucceeds: eight imports of one
// export into eight projects at once are one decision each, as if sent
// one after another: exactly one stores the run and answers 200, the
// others answer 409 naming the project it is in, which is the winner's.
// No import reports a success that did not happen.
func TestConcurrentImportsIntoProjectsOneSucceeds(t *testing.T) {
	s := newServer(t, ingest.Options{})
	body, err := os.ReadFile("testdata/training_metrics.json")
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	answers := make([]response, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = s.post(t, fmt.Sprintf("/api/v1/import?project=p%d", i), body)
		}()
	}
	wg.Wait()
	winner := ""
	for i, a := range answers {
		switch a.Status {
		case http.StatusOK:
			if winner != "" {
				t.Fatalf("imports into %s and p%d both answered 200", winner, i)
			}
			winner = fmt.Sprintf("p%d", i)
		case http.StatusConflict:
		default:
			t.Fatalf("import into p%d: %d %s", i, a.Status, a.Body)
		}
	}
	if winner == "" {
		t.Fatal("no import succeeded")
	}
	var project string
	var runs int
	if err := storetest.Pool(t, s.Store).QueryRow(context.Background(), `SELECT min(project), count(*) FROM runs`).Scan(&project, &runs); err != nil {
		t.Fatal(err)
	}
	if runs != 1 || project != winner {
		t.Fatalf("%d runs, in %q; want one, in %q, the import that answered 200", runs, project, winner)
	}
	for i, a := range answers {
		if a.Status == http.StatusConflict && !strings.Contains(string(a.Body), `project \"`+winner+`\"`) {
			t.Errorf("409 to p%d does not name %s: %s", i, winner, a.Body)
		}
	}
}
