package jobs_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/api"
)

// An agent token acts only as the agents DEEPSEED_AGENT_TOKENS binds it
// to (a name, or a prefix ending in *): heartbeats, claims and reports in
// another agent's name are 403, and so is a report on a job another agent
// holds; the job is left as it was.
func TestAgentTokenBindsNames(t *testing.T) {
	e := start(t)
	e.beat(t, "node1", 2)
	beat := `{"host":"h","gpus":[0],"executor":"local","running":[]}`
	e.must(t, "POST", "/api/v1/agents/gpu-7/heartbeat", fleetTok, beat, 200, nil)
	e.must(t, "POST", "/api/v1/agents/gpu-login/heartbeat", fleetTok, beat, 200, nil)
	code, body := e.do(t, "POST", "/api/v1/agents/node1/heartbeat", fleetTok, beat)
	if code != 403 || !strings.Contains(body, `may not act as agent \"node1\"`) || !strings.Contains(body, "gpu-*, gpu-login") {
		t.Errorf("heartbeat as node1 with the fleet token: %d %s", code, body)
	}
	if strings.Contains(body, fleetTok) {
		t.Errorf("the refusal quotes the token: %s", body)
	}
	if code, body := e.do(t, "POST", "/api/v1/agents/gpu-7/claim", agentTok, `{"free_gpus":[0]}`); code != 403 {
		t.Errorf("claim as gpu-7 with node1's token: %d %s", code, body)
	}

	var j api.Job
	e.must(t, "POST", "/api/v1/jobs", submitTok, `{"project":"p","argv":["true"]}`, 201, &j)
	var r api.AgentClaimReply
	e.must(t, "POST", "/api/v1/agents/node1/claim", agentTok, `{"free_gpus":[0],"executor":"local"}`, 200, &r)
	if r.Job == nil || r.Job.ID != j.ID {
		t.Fatalf("claim: %+v", r.Job)
	}
	id := strconv.FormatInt(j.ID, 10)
	// In its own name, about node1's job: not its job.
	code, body = e.do(t, "POST", "/api/v1/agents/gpu-7/jobs/"+id, fleetTok, `{"state":"finished","exit_code":0}`)
	if code != 403 || !strings.Contains(body, "not held by agent gpu-7") {
		t.Errorf("report on node1's job by gpu-7: %d %s", code, body)
	}
	// In node1's name: the token is not node1's.
	if code, body := e.do(t, "POST", "/api/v1/agents/node1/jobs/"+id, fleetTok, `{"state":"failed","exit_code":1}`); code != 403 {
		t.Errorf("report as node1 with the fleet token: %d %s", code, body)
	}
	var got api.Job
	e.must(t, "GET", "/api/v1/jobs/"+id, readTok, "", 200, &got)
	if got.State != "running" || got.ExitCode != nil || got.Agent != "node1" {
		t.Fatalf("refused reports changed the job: %+v", got)
	}
	e.must(t, "POST", "/api/v1/agents/node1/jobs/"+id, agentTok, `{"state":"finished","exit_code":0}`, 200, &got)
	if got.State != "finished" {
		t.Errorf("node1's own report: %+v", got)
	}
}
