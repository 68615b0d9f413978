package agent_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deepseed/deepseed/agent"
	"github.com/deepseed/deepseed/api"
)

// Exactly once across agent restarts: an agent killed with SIGKILL
// before, as and after its job ends is restarted with the same state
// directory, and the job is reported with its real exit status (read from
// the exit file its wrapper wrote when the agent was not there to see it
// end): never lost, never retried, although it has a retry left.
func TestAgentKilledAroundJobEnd(t *testing.T) {
	for _, c := range []struct {
		when string
		code int
	}{{"before", 3}, {"during", 0}, {"after", 0}} {
		t.Run(c.when, func(t *testing.T) {
			e := start(t, 10*time.Second)
			// The agent reaches the server through a proxy that can be
			// made to refuse, so that the job can end while its report
			// cannot be delivered.
			target, _ := url.Parse(e.url)
			var down atomic.Bool
			var refused atomic.Int32 // reports of the job's end refused
			proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if down.Load() {
					// Only the report of the job's end counts: a report
					// of it running may be refused first, the job still
					// going.
					var rep api.JobReport
					if strings.Contains(r.URL.Path, "/jobs/") && json.NewDecoder(r.Body).Decode(&rep) == nil && rep.State != agent.StateRunning {
						refused.Add(1)
					}
					http.Error(w, `{"error":"down for the test"}`, http.StatusServiceUnavailable)
					return
				}
				httputil.NewSingleHostReverseProxy(target).ServeHTTP(w, r)
			}))
			t.Cleanup(proxy.Close)
			dir := t.TempDir()
			a := childAt(t, e, proxy.URL, "node1", dir)
			waitAgent(t, e, "node1")
			trigger := filepath.Join(t.TempDir(), "end")
			j := e.submit(t, api.JobSubmit{Project: "imdb", Retries: 1, Argv: []string{"sh", "-c",
				`echo started; while [ ! -e "$0" ]; do sleep 0.05; done; echo done; exit "$1"`, trigger, strconv.Itoa(c.code)}})
			j = e.waitJob(t, j.ID, "running", func(j api.Job) bool { return j.State == "running" && j.ExternalID != "" })
			pid, _ := strconv.Atoi(j.ExternalID)
			t.Cleanup(func() { killGroup(j.ExternalID) })
			end := func() {
				if err := os.WriteFile(trigger, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			switch c.when {
			case "before": // the job ends while no agent runs
				kill9(t, a)
				end()
				for deadline := time.Now().Add(agent.WaitDeadline); !gone(pid); time.Sleep(20 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the job never ended")
					}
				}
			case "during": // the agent saw it end but could not report it
				down.Store(true)
				end()
				for deadline := time.Now().Add(agent.WaitDeadline); refused.Load() == 0; time.Sleep(20 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the agent never tried to report the job's end")
					}
				}
				kill9(t, a)
				down.Store(false)
				if got := e.job(t, j.ID); got.State != "running" {
					t.Fatalf("the server heard of the end although every report was refused: %+v", got)
				}
			case "after": // the end was reported
				end()
				e.waitJob(t, j.ID, "ended", func(j api.Job) bool { return j.EndedAt != nil })
				kill9(t, a)
			}
			restarted := time.Now()
			childAt(t, e, proxy.URL, "node1", dir)
			want := "finished"
			if c.code != 0 {
				want = "failed"
			}
			got := e.waitJob(t, j.ID, want, func(j api.Job) bool { return j.EndedAt != nil })
			if got.State != want || got.ExitCode == nil || *got.ExitCode != c.code || got.Attempt != 1 || !strings.Contains(got.OutputTail, "started\ndone\n") {
				t.Fatalf("job ended %s with %+v, want %s with exit code %d", got.State, got, want, c.code)
			}
			// Its runtime, which quotas count, ends when the job did, not
			// when the restarted agent could say so.
			if !got.EndedAt.Before(restarted) {
				t.Errorf("job ended at %v, after the agent's restart at %v", got.EndedAt, restarted)
			}
			// The restarted agent is healthy and runs the next job; the
			// first one never ran twice nor was queued again.
			next := e.submit(t, api.JobSubmit{Project: "imdb", Argv: []string{"true"}})
			e.waitJob(t, next.ID, "finished", state("finished"))
			var l api.JobList
			e.call(t, "GET", "/api/v1/jobs?project=imdb", readTok, nil, &l)
			if l.Counts.Total != 2 || l.Counts.Lost != 0 {
				t.Errorf("jobs after the restart: %+v", l.Counts)
			}
			if got = e.job(t, j.ID); got.State != want || *got.ExitCode != c.code {
				t.Errorf("the job changed after the restart: %+v", got)
			}
		})
	}
}

// An agent killed between starting a job and recording its handle finds
// the job after its restart (its wrapper, by command line and job id) and
// reports it with its real exit status; a job it was starting that left
// no trace is lost, and retried.
func TestAgentKilledWhileStartingAJob(t *testing.T) {
	e := start(t, 10*time.Second)
	dir := t.TempDir()
	beat := api.AgentHeartbeat{Host: "h", GPUs: []int{0, 1}, Executor: "local", Running: []int64{}}
	if code := e.call(t, "POST", "/api/v1/agents/node1/heartbeat", agentTok, beat, nil); code != 200 {
		t.Fatalf("heartbeat: %d", code)
	}
	trigger := filepath.Join(t.TempDir(), "end")
	started := e.submit(t, api.JobSubmit{Project: "imdb", Argv: []string{"sh", "-c", `while [ ! -e "$0" ]; do sleep 0.05; done; exit 5`, trigger}})
	never := e.submit(t, api.JobSubmit{Project: "imdb", Argv: []string{"true"}, Retries: 1})
	var held []string
	for _, gpu := range []int{0, 1} {
		var r api.AgentClaimReply
		if code := e.call(t, "POST", "/api/v1/agents/node1/claim", agentTok, api.AgentClaim{FreeGPUs: []int{gpu}, Executor: "local"}, &r); code != 200 || r.Job == nil {
			t.Fatalf("claim: %d %+v", code, r)
		}
		held = append(held, `{"id":`+strconv.FormatInt(r.Job.ID, 10)+`,"gpu_ids":[`+strconv.Itoa(gpu)+`],"handle":{"executor":"local"},"reported":"","starting":true}`)
	}
	// What the killed agent left: the first job started, its handle not
	// yet recorded; the second not started at all.
	ex, err := agent.NewLocal(dir, agent.JobConfig{AllowRoot: true})
	if err != nil {
		t.Fatal(err)
	}
	h, err := ex.Start(context.Background(), agent.Spec{JobID: strconv.FormatInt(started.ID, 10), Argv: started.Argv,
		Env: []string{"DEEPSEED_JOB_ID=" + strconv.FormatInt(started.ID, 10)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killGroup(h.ExternalID) })
	if err := os.WriteFile(filepath.Join(dir, "state.json"), []byte(`{"agent":"node1","jobs":[`+strings.Join(held, ",")+`]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	child(t, e, "node1", dir)
	j := e.waitJob(t, started.ID, "re-adopted", func(j api.Job) bool { return j.ExternalID == h.ExternalID })
	if j.State != "running" {
		t.Fatalf("the job being started: %+v", j)
	}
	n := e.waitJob(t, never.ID, "lost", state("lost"))
	if !strings.Contains(n.Detail, "whether it ran is unknown") || !strings.Contains(n.Detail, "retried as job") {
		t.Errorf("the job that never started: %+v", n)
	}
	if err := os.WriteFile(trigger, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	j = e.waitJob(t, started.ID, "failed", state("failed"))
	if j.ExitCode == nil || *j.ExitCode != 5 || j.Attempt != 1 {
		t.Errorf("the job being started, once ended: %+v", j)
	}
}
