package api_test

import (
	"errors"
	"fmt"

	"github.com/deepseed/deepseed/api"
)

// An ingest body is NDJSON (or a JSON array) of records as the hook
// writes them: Python's bare NaN is accepted, blank lines are skipped, and
// a steps record (the hook's columns of many steps) becomes one step record
// per step with ExpandSteps.
func ExampleDecodeBatch() {
	body := []byte(`{"kind":"run","run_id":"r1","project":"imdb","name":"bert-large"}

{"kind":"step","run_id":"r1","rank":0,"step":1,"time":1735689600,"loss":NaN,"step_ms":212.5}
{"kind":"steps","run_id":"r1","rank":0,"step":[2,3],"time":[1735689601,1735689602],"loss":[0.71,0.69],"step_ms":[210,208.25]}
`)
	recs, err := api.DecodeBatch(body)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range api.ExpandSteps(recs) {
		switch r.Kind() {
		case api.KindRun:
			fmt.Printf("run %s: project %s, name %s\n", r.Run.RunID, r.Run.Project, r.Run.Name)
		case api.KindStep:
			s := r.Step
			fmt.Printf("step %d of rank %d: loss %v, %v ms\n", *s.Step, s.Rank, float64(*s.Loss), float64(*s.StepMS))
		}
	}
	// Output:
	// run r1: project imdb, name bert-large
	// step 1 of rank 0: loss NaN, 212.5 ms
	// step 2 of rank 0: loss 0.71, 210 ms
	// step 3 of rank 0: loss 0.69, 208.25 ms
}

// A bad record refuses the whole batch: the error is a *RecordError that
// names the record, its line and the field, which the server returns to the
// client with a 400.
func ExampleDecodeBatch_badRecord() {
	body := []byte(`{"kind":"step","run_id":"r1","rank":0,"step":1,"time":1735689600}
{"kind":"step","run_id":"r1","rank":-1,"step":2,"time":1735689601}
`)
	recs, err := api.DecodeBatch(body)
	var re *api.RecordError
	if errors.As(err, &re) {
		fmt.Printf("%d records; record %d (line %d), field %s: %s\n", len(recs), re.Index, re.Line, re.Field, re.Msg)
	}
	_, err = api.DecodeBatch([]byte("\n \n"))
	fmt.Println(errors.Is(err, api.ErrEmptyBatch))
	// Output:
	// 0 records; record 1 (line 2), field rank: want 0 to 1048576, got -1
	// true
}

// NDJSONLines is how every reader of NDJSON splits a body: the line numbers
// are those of the body, blank lines skipped, white space trimmed.
func ExampleNDJSONLines() {
	body := []byte("{\"kind\":\"run\"}\r\n\n  {\"kind\":\"step\"}  \n")
	for n, line := range api.NDJSONLines(body) {
		fmt.Printf("line %d: %s\n", n, line)
	}
	// Output:
	// line 1: {"kind":"run"}
	// line 3: {"kind":"step"}
}
