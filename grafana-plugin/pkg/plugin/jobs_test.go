package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/jobs/jobstest"
	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/server/servertest"
	"github.com/deepseed/deepseed/store/storetest"
)

const (
	submitToken = "plugin-test-submit-token"
	agentToken  = "plugin-test-agent-token"
)

// startJobServer runs a real server with a token of each scope and seeds
// it with a sweep run by a real agent (see package jobstest).
func startJobServer(t *testing.T) (string, jobstest.Seeded) {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.IngestTokens, cfg.ReadTokens = []string{ingestToken}, []string{readToken}
	cfg.SubmitTokens, cfg.AgentTokens = []string{submitToken}, []string{jobstest.AgentName + ":" + agentToken}
	cfg.AlertsEvery = -1
	base := servertest.Start(t, cfg, storetest.NewStore(t))
	s := jobstest.Seed(t, jobstest.Server{URL: base, Submit: submitToken, Agent: agentToken, Ingest: ingestToken}, "imdb")
	t.Log(s)
	return base, s
}

// queryFrames runs queries through the gRPC harness with the read token
// and returns each one's response by name.
func queryFrames(t *testing.T, base string, queries map[string]string) map[string]backend.DataResponse {
	t.Helper()
	tp := startPlugin(t)
	req := &backend.QueryDataRequest{PluginContext: pluginContext("jobs", base, readToken)}
	for name, q := range queries {
		req.Queries = append(req.Queries, backend.DataQuery{RefID: name, JSON: json.RawMessage(q),
			TimeRange: backend.TimeRange{From: time.Now().Add(-time.Hour), To: time.Now()}})
	}
	resp, err := tp.Client.QueryData(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Responses
}

func field(t *testing.T, f *data.Frame, name string) *data.Field {
	t.Helper()
	fl, i := f.FieldByName(name)
	if i < 0 {
		t.Fatalf("frame %s has no field %s", f.Name, name)
	}
	return fl
}

func display(fl *data.Field) string {
	if fl.Config == nil {
		return ""
	}
	return fl.Config.DisplayNameFromDS
}

func unit(fl *data.Field) string {
	if fl.Config == nil {
		return ""
	}
	return fl.Config.Unit
}

// TestJobQueries runs the job query types through the gRPC harness
// against a real server whose jobs a real agent ran, and checks each frame
// against what the server's API says of the same jobs.
func TestJobQueries(t *testing.T) {
	base, seed := startJobServer(t)
	sweep := seed.Sweep.ID
	responses := queryFrames(t, base, map[string]string{
		"jobs":          `{"queryType":"jobs","project":"imdb"}`,
		"jobs_all":      `{"queryType":"jobs","project":"*","sweep":"*","state":"*"}`,
		"jobs_failed":   `{"queryType":"jobs","state":"failed"}`,
		"counts":        `{"queryType":"job_counts"}`,
		"counts_sweep":  fmt.Sprintf(`{"queryType":"job_counts","sweep":%q}`, sweep),
		"quotas":        `{"queryType":"quotas","project":"*"}`,
		"quota_other":   fmt.Sprintf(`{"queryType":"quotas","project":%q}`, seed.Other),
		"trials":        fmt.Sprintf(`{"queryType":"sweep_trials","sweep":%q}`, sweep),
		"trials_newest": `{"queryType":"sweep_trials","sweep":"*","project":"imdb","metric":"val_loss"}`,
		"bad_state":     `{"queryType":"jobs","state":"done"}`,
		"bad_goal":      `{"queryType":"sweep_trials","sweep":"x","goal":"up"}`,
		"no_sweep":      `{"queryType":"sweep_trials","sweep":"sw-nothere"}`,
		"bad_metric":    fmt.Sprintf(`{"queryType":"sweep_trials","sweep":%q,"metric":"no such"}`, sweep),
	})
	ok := func(name string) *data.Frame {
		t.Helper()
		r := responses[name]
		if r.Error != nil {
			t.Fatalf("%s: %v", name, r.Error)
		}
		if len(r.Frames) != 1 {
			t.Fatalf("%s: %d frames, want 1", name, len(r.Frames))
		}
		return r.Frames[0]
	}
	byID := map[int64]api.Job{}
	finished, failed := 0, 0
	for _, j := range seed.Jobs {
		byID[j.ID] = j
		switch j.State {
		case "finished":
			finished++
		case "failed":
			failed++
		}
	}

	t.Run("jobs table", func(t *testing.T) {
		f := ok("jobs")
		if f.Rows() != len(seed.Sweep.Trials) {
			t.Fatalf("%d rows, want the sweep's %d jobs of imdb", f.Rows(), len(seed.Sweep.Trials))
		}
		for _, c := range []struct{ name, display, unit string }{
			{"id", "Job", "none"}, {"project", "Project", ""}, {"sweep_id", "Sweep", ""}, {"params", "Params", ""},
			{"state", "State", ""}, {"runtime_s", "Runtime", "s"}, {"gpu_hours", "GPU-hours", api.GPUHoursUnit},
			{"agent", "Agent", ""}, {"external_id", "Slurm job / pid", ""}, {"run_id", "Run", ""},
		} {
			fl := field(t, f, c.name)
			if display(fl) != c.display || unit(fl) != c.unit {
				t.Errorf("field %s: display %q unit %q, want %q %q", c.name, display(fl), unit(fl), c.display, c.unit)
			}
		}
		ids, runs := field(t, f, "id"), field(t, f, "run_id")
		for i := 0; i < f.Rows(); i++ {
			id := *ids.At(i).(*int64)
			j, found := byID[id]
			if !found {
				t.Fatalf("row %d: job %d is not in the API's list", i, id)
			}
			if i > 0 && id > *ids.At(i - 1).(*int64) {
				t.Errorf("row %d: job %d after %d, want newest first", i, id, *ids.At(i - 1).(*int64))
			}
			for name, want := range map[string]string{"state": j.State, "sweep_id": seed.Sweep.ID, "agent": "seed-node",
				"params": "code=" + j.Params["code"] + " lr=" + j.Params["lr"], "external_id": j.ExternalID} {
				if got := field(t, f, name).At(i).(string); got != want {
					t.Errorf("job %d: %s %q, want %q", id, name, got, want)
				}
			}
			if j.ExternalID == "" {
				t.Errorf("job %d: the local executor gave no pid", id)
			}
			if got := runs.At(i).(string); got != j.RunID {
				t.Errorf("job %d: run %q, want %q", id, got, j.RunID)
			}
			if _, seeded := seed.Evals[id]; seeded && j.RunID != "job-"+strconv.FormatInt(id, 10) {
				t.Errorf("job %d: its run job-%d is not linked (%q)", id, id, j.RunID)
			}
			code := field(t, f, "exit_code").At(i).(*int64)
			if code == nil || strconv.FormatInt(*code, 10) != j.Params["code"] {
				t.Errorf("job %d: exit code %v, want %s", id, code, j.Params["code"])
			}
			// The run link opens the job's window: it holds the job.
			from, to := field(t, f, "run_from").At(i).(*int64), field(t, f, "run_to").At(i).(*int64)
			if from == nil || to == nil || *from > j.StartedAt.UnixMilli() || *to < j.EndedAt.UnixMilli() {
				t.Errorf("job %d: window %v..%v does not hold %v..%v", id, from, to, j.StartedAt, j.EndedAt)
			}
		}
		if all := ok("jobs_all"); all.Rows() != len(seed.Jobs) {
			t.Errorf("All filters: %d rows, want every one of %d jobs", all.Rows(), len(seed.Jobs))
		}
		fl := ok("jobs_failed")
		if fl.Rows() != failed {
			t.Errorf("state failed: %d rows, want %d", fl.Rows(), failed)
		}
		for i := 0; i < fl.Rows(); i++ {
			if s := field(t, fl, "state").At(i).(string); s != "failed" {
				t.Errorf("state filter failed lets %s through", s)
			}
		}
	})

	t.Run("job counts", func(t *testing.T) {
		f := ok("counts")
		if f.Meta == nil || f.Meta.Type != data.FrameTypeNumericWide {
			t.Errorf("meta %+v, want numeric-wide", f.Meta)
		}
		want := map[string]float64{"total": float64(len(seed.Jobs)), "active": 0, "done": float64(finished), "failed": float64(failed)}
		for name, v := range want {
			fl := field(t, f, name)
			if got := *fl.At(0).(*float64); got != v {
				t.Errorf("%s = %v, want %v", name, got, v)
			}
			if display(fl) == "" {
				t.Errorf("%s has no display name", name)
			}
		}
		if finished == 0 || failed == 0 {
			t.Errorf("the seed should have finished and failed jobs: %d, %d", finished, failed)
		}
		sw := ok("counts_sweep")
		if got := *field(t, sw, "total").At(0).(*float64); got != float64(len(seed.Sweep.Trials)) {
			t.Errorf("sweep total %v, want %d", got, len(seed.Sweep.Trials))
		}
	})

	t.Run("quotas", func(t *testing.T) {
		var want api.Quota
		getJSON(t, base, "/api/v1/quotas/imdb", &want)
		f := ok("quotas")
		if len(f.Fields) != 1 {
			t.Fatalf("%d fields, want one per project with a quota", len(f.Fields))
		}
		fl := f.Fields[0]
		if fl.Labels["project"] != "imdb" || fl.Config.Max == nil || float64(*fl.Config.Max) != seed.Limit {
			t.Errorf("field labels %v max %v, want imdb with max %v", fl.Labels, fl.Config.Max, seed.Limit)
		}
		if got := *fl.At(0).(*float64); got <= 0 || got > want.UsedGPUHours*1.01+1e-6 || got < want.UsedGPUHours*0.99 {
			t.Errorf("used %v GPU-hours, the API says %v", got, want.UsedGPUHours)
		}
		if display(fl) != "imdb (limit 30 GPU-h)" || unit(fl) != api.GPUHoursUnit {
			t.Errorf("display %q unit %q", display(fl), unit(fl))
		}
		other := ok("quota_other").Fields[0]
		if other.Config.Max != nil || display(other) != seed.Other+" (no limit)" || *other.At(0).(*float64) <= 0 {
			t.Errorf("a project without a quota: max %v display %q used %v", other.Config.Max, display(other), *other.At(0).(*float64))
		}
	})

	t.Run("sweep trials", func(t *testing.T) {
		f := ok("trials")
		if f.Rows() != len(seed.Sweep.Trials) {
			t.Fatalf("%d rows, want %d trials", f.Rows(), len(seed.Sweep.Trials))
		}
		lr, code := field(t, f, "param.lr"), field(t, f, "param.code")
		if display(lr) != "lr" || lr.Type() != data.FieldTypeNullableFloat64 || code.Type() != data.FieldTypeNullableFloat64 {
			t.Errorf("param columns: %q %s, %s; want numbers named by the parameter", display(lr), lr.Type(), code.Type())
		}
		// Learning rates in scientific notation (5.00e-5), exit codes
		// as they are.
		if unit(lr) != "sci" || unit(code) != "none" {
			t.Errorf("param units: lr %q, code %q; want sci and none", unit(lr), unit(code))
		}
		final, best := field(t, f, "final"), field(t, f, "best")
		if display(best) != "Best val_accuracy" || unit(best) != "percentunit" {
			t.Errorf("best: display %q unit %q", display(best), unit(best))
		}
		var order []float64
		for i := 0; i < f.Rows(); i++ {
			id := *field(t, f, "id").At(i).(*int64)
			e, scored := seed.Evals[id]
			b, fn := best.At(i).(*float64), final.At(i).(*float64)
			rank := field(t, f, "rank").At(i).(*int64)
			if !scored {
				if b != nil || rank != nil {
					t.Errorf("job %d has no run but best %v rank %v", id, b, rank)
				}
				continue
			}
			if b == nil || fn == nil || *b != e.Best || *fn != e.Final || rank == nil || *rank != int64(i+1) {
				t.Errorf("row %d job %d: rank %v final %v best %v, want rank %d final %v best %v", i, id, rank, fn, b, i+1, e.Final, e.Best)
				continue
			}
			order = append(order, *b)
		}
		if len(order) != len(seed.Evals) || !slices.IsSortedFunc(order, func(a, b float64) int { return -cmpFloat(a, b) }) {
			t.Errorf("best values %v: want all %d scored trials, best first", order, len(seed.Evals))
		}
		// All picks the newest sweep; val_loss ranks lowest first.
		n := ok("trials_newest")
		if n.Meta.Custom.(map[string]any)["sweep"] != seed.Sweep.ID {
			t.Errorf("sweep * shows %v, want the newest %s", n.Meta.Custom, seed.Sweep.ID)
		}
		nb := field(t, n, "best")
		if display(nb) != "Best val_loss" || unit(nb) != "none" {
			t.Errorf("val_loss column %q %q", display(nb), unit(nb))
		}
		var losses []float64
		for i := 0; i < n.Rows(); i++ {
			if v := nb.At(i).(*float64); v != nil {
				losses = append(losses, *v)
			}
		}
		if len(losses) != len(seed.Evals) || !slices.IsSorted(losses) {
			t.Errorf("val_loss best %v, want lowest first", losses)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for name, want := range map[string]backend.Status{
			"bad_state": backend.StatusBadRequest, "bad_goal": backend.StatusBadRequest,
			"no_sweep": backend.StatusNotFound, "bad_metric": backend.StatusBadRequest,
		} {
			r := responses[name]
			if r.Error == nil || r.Status != want {
				t.Errorf("%s: status %v error %v, want %v", name, r.Status, r.Error, want)
			}
		}
	})
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func getJSON(t *testing.T, base, path string, out any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+path, nil)
	req.Header.Set("Authorization", "Bearer "+readToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", path, res.StatusCode)
	}
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
}

// TestJobResources checks the job variables' lists through the harness.
func TestJobResources(t *testing.T) {
	base, seed := startJobServer(t)
	tp := startPlugin(t)
	pc := pluginContext("jobs-resources", base, readToken)
	get := func(path string, want int) []Option {
		t.Helper()
		var s sink
		name, _, _ := strings.Cut(path, "?")
		if err := tp.Client.CallResource(context.Background(), &backend.CallResourceRequest{
			PluginContext: pc, Path: name, Method: http.MethodGet, URL: path}, &s); err != nil {
			t.Fatal(err)
		}
		resp := s.resp
		if resp.Status != want {
			t.Fatalf("%s: %d %s, want %d", path, resp.Status, resp.Body, want)
		}
		var opts []Option
		if want == http.StatusOK {
			if err := json.Unmarshal(resp.Body, &opts); err != nil {
				t.Fatal(err)
			}
		}
		return opts
	}
	values := func(opts []Option) []string {
		var out []string
		for _, o := range opts {
			out = append(out, o.Value)
		}
		return out
	}
	for _, c := range []struct {
		path string
		want []string
	}{
		{"job_projects", []string{seed.Project, seed.Other}},
		{"job_sweeps?project=" + seed.Project, []string{seed.Sweep.ID}},
		{"job_sweeps?project=" + seed.Other, nil},
		{"job_states", JobStates},
		// The sweep's own metric first, then its runs' evaluations.
		{"sweep_metrics?sweep=" + seed.Sweep.ID, []string{"val_accuracy", "val_loss"}},
		{"sweep_metrics?sweep=*&project=" + seed.Project, []string{"val_accuracy", "val_loss"}},
		{"sweep_goals?sweep=" + seed.Sweep.ID, []string{"max", "min"}},
		{"sweep_goals?sweep=" + seed.Sweep.ID + "&metric=val_loss", []string{"min", "max"}},
	} {
		if got := values(get(c.path, http.StatusOK)); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.path, got, c.want)
		}
	}
	get("sweep_metrics?sweep=sw-nothere", http.StatusNotFound)
}
