package jobs_test

import (
	"strconv"
	"testing"

	"github.com/deepseed/deepseed/api"
)

// GET /api/v1/sweeps lists sweeps newest first with the counters of their
// trials, filtered by project; a bad filter is 400.
func TestListSweeps(t *testing.T) {
	e := start(t)
	e.beat(t, "node1", 2)
	var empty api.SweepList
	e.must(t, "GET", "/api/v1/sweeps", readTok, "", 200, &empty)
	if empty.Sweeps == nil || len(empty.Sweeps) != 0 || empty.Limit != 100 {
		t.Fatalf("no sweep yet: %+v", empty)
	}
	var a, b, c api.Sweep
	e.must(t, "POST", "/api/v1/sweeps", submitTok, `{"project":"imdb","argv":["train","{lr}"],"params":{"lr":"1,2,3"}}`, 201, &a)
	e.must(t, "POST", "/api/v1/sweeps", submitTok, `{"project":"qa","argv":["train","{lr}"],"params":{"lr":"1,2"}}`, 201, &b)
	e.must(t, "POST", "/api/v1/sweeps", submitTok, `{"project":"imdb","argv":["train","{lr}"],"params":{"lr":"5"},"metric":"val_loss"}`, 201, &c)
	e.must(t, "POST", "/api/v1/jobs/"+strconv.FormatInt(a.Trials[0].Job.ID, 10)+"/cancel", submitTok, "", 200, nil)

	var all api.SweepList
	e.must(t, "GET", "/api/v1/sweeps", readTok, "", 200, &all)
	if len(all.Sweeps) != 3 || all.Sweeps[0].ID != c.ID || all.Sweeps[1].ID != b.ID || all.Sweeps[2].ID != a.ID {
		t.Fatalf("all sweeps, newest first: %+v", all.Sweeps)
	}
	got := all.Sweeps[2]
	if got.Project != "imdb" || got.Counts.Total != 3 || got.Counts.Queued != 2 || got.Counts.Cancelled != 1 || got.Params["lr"] != "1,2,3" {
		t.Errorf("sweep %s: %+v", a.ID, got)
	}
	if all.Sweeps[0].Metric != "val_loss" || all.Sweeps[1].Counts.Total != 2 {
		t.Errorf("sweeps: %+v", all.Sweeps)
	}
	var imdb api.SweepList
	e.must(t, "GET", "/api/v1/sweeps?project=imdb&limit=1", readTok, "", 200, &imdb)
	if len(imdb.Sweeps) != 1 || imdb.Sweeps[0].ID != c.ID || imdb.Limit != 1 {
		t.Errorf("newest sweep of imdb: %+v", imdb)
	}
	e.must(t, "GET", "/api/v1/sweeps?limit=0", readTok, "", 400, nil)
	e.must(t, "GET", "/api/v1/sweeps?project=a%20b", readTok, "", 400, nil)
}
