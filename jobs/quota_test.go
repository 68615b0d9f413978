package jobs_test

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// Six one-GPU jobs that each run for a second pass a quota of 4
// GPU-seconds: the seventh, queued before, is not started by any agent,
// and the next submission is refused with 409 and the usage.
func TestQuotaRefusesSeventhJob(t *testing.T) {
	e := start(t)
	e.beat(t, "node1", 8)
	var q api.Quota
	e.must(t, "PUT", "/api/v1/quotas/imdb", submitTok, `{"gpu_hours":0.00111}`, 404, nil) // no job of imdb yet
	var first api.Job
	e.must(t, "POST", "/api/v1/jobs", submitTok, `{"project":"imdb","argv":["true"]}`, 201, &first)
	e.must(t, "PUT", "/api/v1/quotas/imdb", submitTok, `{"gpu_hours":0.00111}`, 200, &q)
	for i := 2; i <= 7; i++ {
		e.must(t, "POST", "/api/v1/jobs", submitTok, `{"project":"imdb","argv":["true"]}`, 201, nil)
	}
	var claimed []int64
	for i := 0; i < 6; i++ {
		var r api.AgentClaimReply
		e.must(t, "POST", "/api/v1/agents/node1/claim", agentTok, `{"free_gpus":[`+strconv.Itoa(i)+`],"executor":"local"}`, 200, &r)
		if r.Job == nil {
			t.Fatalf("claim %d: no job", i)
		}
		claimed = append(claimed, r.Job.ID)
	}
	if claimed[0] != first.ID {
		t.Errorf("the oldest job was not claimed first: %v, first %d", claimed, first.ID)
	}
	time.Sleep(1100 * time.Millisecond)
	for _, id := range claimed {
		e.must(t, "POST", "/api/v1/agents/node1/jobs/"+strconv.FormatInt(id, 10), agentTok, `{"state":"finished","exit_code":0}`, 200, nil)
	}
	e.must(t, "GET", "/api/v1/quotas/imdb", readTok, "", 200, &q)
	if !q.Exceeded || q.UsedGPUHours < 6.0/3600 || q.JobGPUHours != q.UsedGPUHours {
		t.Fatalf("after six 1-GPU jobs of over a second: %+v", q)
	}
	time.Sleep(1100 * time.Millisecond) // the claim path's cache of projects over quota
	var r api.AgentClaimReply
	e.must(t, "POST", "/api/v1/agents/node1/claim", agentTok, `{"free_gpus":[0,1],"executor":"local"}`, 200, &r)
	if r.Job != nil {
		t.Fatalf("the seventh job started although the quota is used up: %+v", r.Job)
	}
	code, body := e.do(t, "POST", "/api/v1/jobs", submitTok, `{"project":"imdb","argv":["true"]}`)
	if code != 409 || !regexp.MustCompile(`^\{"error":"quota exceeded: 0\.00\d+ of 0\.00111 GPU-hours used"\}`).MatchString(body) {
		t.Fatalf("submission over quota: %d %s", code, body)
	}
	// Raising the limit lets the seventh job start.
	e.must(t, "PUT", "/api/v1/quotas/imdb", submitTok, `{"gpu_hours":30}`, 200, &q)
	e.must(t, "POST", "/api/v1/agents/node1/claim", agentTok, `{"free_gpus":[0],"executor":"local"}`, 200, &r)
	if r.Job == nil || r.Job.ID != claimed[5]+1 {
		t.Fatalf("after raising the quota: %+v, want job %d", r.Job, claimed[5]+1)
	}
}

// The two-sample attack: a GPU sample dated 1970 and one now for a run of
// the project would make its telemetry span half a million GPU-hours.
// Quota decisions count jobs only, and the telemetry shown is clamped to
// the run's lifetime as the server saw it: nothing is refused.
func TestTelemetryCannotUseUpQuota(t *testing.T) {
	e := start(t)
	e.beat(t, "node1", 1)
	now := time.Now().UTC().Format(time.RFC3339Nano)
	e.must(t, "POST", "/api/v1/ingest", ingestTok, `{"kind":"run","run_id":"victim-run","project":"imdb"}
{"kind":"gpu","time":1,"host":"n1","gpu":0,"run_id":"victim-run","util_pct":90}
{"kind":"gpu","time":"`+now+`","host":"n1","gpu":0,"run_id":"victim-run","util_pct":90}
`, 200, nil)
	var q api.Quota
	e.must(t, "PUT", "/api/v1/quotas/imdb", submitTok, `{"gpu_hours":1}`, 200, &q)
	if q.Exceeded || q.UsedGPUHours != 0 || q.RunGPUHours >= 1 || q.RunGPUHours < 0 {
		t.Fatalf("after the two-sample attack: %+v, want nothing used and the run's telemetry within its lifetime", q)
	}
	var j api.Job
	e.must(t, "POST", "/api/v1/jobs", submitTok, `{"project":"imdb","argv":["true"]}`, 201, &j)
	time.Sleep(1100 * time.Millisecond) // the claim path's cache of projects over quota
	var r api.AgentClaimReply
	e.must(t, "POST", "/api/v1/agents/node1/claim", agentTok, `{"free_gpus":[0],"executor":"local"}`, 200, &r)
	if r.Job == nil || r.Job.ID != j.ID {
		t.Fatalf("the project's job was not handed out: %+v", r.Job)
	}
	var qs api.QuotaList
	e.must(t, "GET", "/api/v1/quotas", readTok, "", 200, &qs)
	if len(qs.Quotas) != 1 || qs.Quotas[0].Exceeded {
		t.Fatalf("quotas: %+v", qs.Quotas)
	}
}

// A report's ended_at ends the job's runtime when the executor saw it end,
// but never before its start nor after now: an agent cannot stretch or
// invert what the quota counts.
func TestReportedEndIsBounded(t *testing.T) {
	e := start(t)
	e.beat(t, "node1", 3)
	var ids []string
	for i := 0; i < 3; i++ {
		var r api.AgentClaimReply
		e.must(t, "POST", "/api/v1/jobs", submitTok, `{"project":"imdb","argv":["true"]}`, 201, nil)
		e.must(t, "POST", "/api/v1/agents/node1/claim", agentTok, `{"free_gpus":[`+strconv.Itoa(i)+`],"executor":"local"}`, 200, &r)
		ids = append(ids, strconv.FormatInt(r.Job.ID, 10))
	}
	before := time.Now()
	var early, past, future api.Job
	e.must(t, "POST", "/api/v1/agents/node1/jobs/"+ids[0], agentTok, `{"state":"finished","exit_code":0,"ended_at":"1970-01-01T00:00:01Z"}`, 200, &early)
	e.must(t, "POST", "/api/v1/agents/node1/jobs/"+ids[1], agentTok, `{"state":"finished","exit_code":0,"ended_at":"2100-01-01T00:00:00Z"}`, 200, &future)
	e.must(t, "POST", "/api/v1/agents/node1/jobs/"+ids[2], agentTok, `{"state":"failed","exit_code":2,"ended_at":"`+before.UTC().Format(time.RFC3339Nano)+`"}`, 200, &past)
	if !early.EndedAt.Equal(*early.StartedAt) || early.RuntimeSeconds != 0 {
		t.Errorf("an end before the start: %v .. %v, runtime %v", early.StartedAt, early.EndedAt, early.RuntimeSeconds)
	}
	if future.EndedAt.After(time.Now()) {
		t.Errorf("an end in 2100 was kept: %v", future.EndedAt)
	}
	if d := past.EndedAt.Sub(before); d < -time.Microsecond || d > time.Microsecond { // PostgreSQL keeps microseconds
		t.Errorf("the reported end %v was not kept: %v", before, past.EndedAt)
	}
	var q api.Quota
	e.must(t, "GET", "/api/v1/quotas/imdb", readTok, "", 200, &q)
	if q.JobGPUHours > 1 {
		t.Errorf("GPU-hours %v after jobs of less than a second", q.JobGPUHours)
	}
}
