package store_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// A store on a PostgreSQL database: migrate it, write the records the hook
// sent (as ingest does) and read a run and a series back.
//
// Here the database is a throwaway one of the tests; yours is the URL
// serve takes (DEEPSEED_DATABASE_URL).
func ExampleStore() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := store.Open(ctx, storetest.ExampleDatabase(), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	recs, err := api.DecodeBatch([]byte(`{"kind":"run","run_id":"r1","project":"imdb","name":"bert-large"}
{"kind":"step","run_id":"r1","rank":0,"step":1,"time":1735689600,"loss":0.73,"step_ms":212.5}
{"kind":"step","run_id":"r1","rank":0,"step":2,"time":1735689601,"loss":0.71,"step_ms":210}
`))
	if err != nil {
		log.Fatal(err)
	}
	res, err := st.WriteBatch(ctx, recs)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("accepted:", res.Accepted)

	run, err := st.GetRun(ctx, "r1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("run:", run.RunID, run.Project, run.Name)
	pts, err := st.SeriesRaw(ctx, "r1", 0, "step_ms", 1, 2)
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range pts {
		fmt.Println("step", p.Step, "step_ms", p.Value)
	}
	// Output:
	// accepted: 3
	// run: r1 imdb bert-large
	// step 1 step_ms 212.5
	// step 2 step_ms 210
}
