package plugin

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/grafana/grafana-plugin-sdk-go/backend"

	"github.com/deepseed/deepseed/api"
)

// TestCheckHealth is "Save & test": it passes with a read token and says
// which check failed otherwise.
func TestCheckHealth(t *testing.T) {
	base := startServer(t)
	tp := startPlugin(t)

	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + l.Addr().String()
	l.Close()

	// A server that answers but is not ready (its database is gone).
	notReady := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":"database unavailable"}`))
	})}
	nl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go notReady.Serve(nl)
	t.Cleanup(func() { notReady.Close() })

	cases := []struct {
		name, url, token string
		status           backend.HealthStatus
		msg              string
	}{
		{"read token", base, readToken, backend.HealthStatusOk, "token accepted"},
		{"ingest token", base, ingestToken, backend.HealthStatusOk, "token accepted"},
		{"wrong token", base, "not-a-token", backend.HealthStatusError, "rejected the token"},
		{"no token", base, "", backend.HealthStatusError, "requires a token"},
		{"unreachable", down, readToken, backend.HealthStatusError, "unreachable"},
		{"not ready", "http://" + nl.Addr().String(), readToken, backend.HealthStatusError, "not ready: deepseed server: 503: database unavailable"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := tp.Client.CheckHealth(context.Background(), &backend.CheckHealthRequest{
				PluginContext: pluginContext("health-"+c.name, c.url, c.token),
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != c.status || !strings.Contains(res.Message, c.msg) {
				t.Fatalf("got %v %q; want %v containing %q", res.Status, res.Message, c.status, c.msg)
			}
			if c.token != "" && strings.Contains(res.Message, c.token) {
				t.Fatalf("the message shows the token: %q", res.Message)
			}
		})
	}
}

// sink collects what CallResource sends.
type sink struct{ resp *backend.CallResourceResponse }

func (s *sink) Send(r *backend.CallResourceResponse) error { s.resp = r; return nil }

// TestCallResource fetches the lists behind the template variables.
func TestCallResource(t *testing.T) {
	base := startServer(t)
	// Beside the fixture's sweep: a run of no sweep, which the sweeps list
	// leaves out, a sweep of another project, its two runs of one name
	// (told apart by their ids), and a sweep of one run, left out too:
	// there is nothing to compare its run with.
	ingest(t, base, append(fixtureRecords(),
		map[string]any{"kind": "run", "run_id": "bert-solo", "project": "nlp", "name": "BERT alone", "started_at": ts(0)},
		map[string]any{"kind": "run", "run_id": "vit-lr1", "project": "vision", "name": "ViT lr 1", "started_at": ts(0),
			"sweep_id": "lr-sweep"},
		map[string]any{"kind": "run", "run_id": "vit-lr1-again", "project": "vision", "name": "ViT lr 1", "started_at": ts(0),
			"sweep_id": "lr-sweep"},
		map[string]any{"kind": "run", "run_id": "vit-alone", "project": "vision", "name": "ViT alone", "started_at": ts(0),
			"sweep_id": "one-run-sweep"},
	))
	tp := startPlugin(t)
	pc := pluginContext("resources", base, readToken)

	cases := []struct {
		path   string
		status int
		want   string // the JSON answer, or a part of the error
	}{
		{"projects", 200, `[{"text":"nlp","value":"nlp"},{"text":"vision","value":"vision"}]`},
		{"sweeps?project=nlp", 200, `[{"text":"zero-sweep","value":"zero-sweep"}]`},
		{"sweeps?project=vision", 200, `[{"text":"lr-sweep","value":"lr-sweep"}]`},
		{"sweeps", 200, `[{"text":"lr-sweep","value":"lr-sweep"},{"text":"zero-sweep","value":"zero-sweep"}]`},
		{"sweeps?project=other", 200, `[]`},
		{"runs?sweep=lr-sweep", 200, `{"text":"ViT lr 1 · …r1-again","value":"vit-lr1-again"}`},
		{"runs?sweep=lr-sweep", 200, `{"text":"ViT lr 1 · vit-lr1","value":"vit-lr1"}`},
		{"runs?project=nlp", 200, `{"text":"BERT ZeRO-3","value":"bert-z3"}`},
		{"runs?project=other", 200, `[]`},
		// The baseline list: the first selected run, then the runs.
		{"runs?project=nlp&baseline=true", 200, `[{"text":"First selected run","value":"@first"},{"text":"BERT`},
		{"runs?project=other&baseline=true", 200, `[{"text":"First selected run","value":"@first"}]`},
		{"runs?sweep=zero-sweep&tag=bert", 200, `"value":"bert-z2"`},
		{"metrics?run=bert-z2", 200, `{"text":"metrics.tokens_seen","value":"metrics.tokens_seen"}`},
		{"metrics", 200, `{"text":"loss","value":"loss"}`},
		{"ranks?run=bert-z2", 200, `[{"text":"0","value":"0"},{"text":"1","value":"1"}]`},
		{"ranks?run=nope", 404, "not found"},
		{"ranks", 404, "ranks needs ?run="},
		{"hosts?from=2024-03-01T11:00:00Z&to=2024-03-01T13:00:00Z", 200, `[{"text":"node-a","value":"node-a"}]`},
		{"hosts?run=bert-z2", 200, `[{"text":"node-a","value":"node-a"}]`},
		// An explicit range that ended in the past: panels follow it.
		{"window?run=bert-z2&part=shift&to=2024-03-01T13:00:00Z", 200, `[{"text":"0s","value":"0s"}]`},
		{"window?run=bert-z2&part=from", 200, `"value":"17092`},
		{"window?run=bert-z2&part=bogus", 404, "want one of span, shift, from, to"},
		{"window?part=span", 404, "window needs ?run="},
		{"window?run=nope&part=span", 404, "not found"},
		{"nothing", 404, "unknown resource"},
		// A server without jobs: empty lists (TestJobResources has jobs).
		{"job_projects", 200, `[]`},
		{"job_sweeps?project=nlp", 200, `[]`},
		{"job_states", 200, `[{"text":"queued","value":"queued"},{"text":"running","value":"running"},{"text":"finished","value":"finished"},{"text":"failed","value":"failed"},{"text":"cancelled","value":"cancelled"},{"text":"lost","value":"lost"}]`},
		{"sweep_metrics", 200, `[]`},
		{"sweep_goals?metric=val_loss", 200, `[{"text":"min","value":"min"},{"text":"max","value":"max"}]`},
	}
	// Every resource a variable query may name is served.
	for _, r := range api.VariableResources {
		covered := false
		for _, c := range cases {
			path, _, _ := strings.Cut(c.path, "?")
			covered = covered || path == r && c.status == http.StatusOK
		}
		if !covered {
			t.Errorf("no case lists the %s resource of api.VariableResources", r)
		}
	}
	for _, c := range cases {
		t.Run(c.path, func(t *testing.T) {
			path, _, _ := strings.Cut(c.path, "?")
			var s sink
			err := tp.Client.CallResource(context.Background(), &backend.CallResourceRequest{
				PluginContext: pc, Path: path, Method: http.MethodGet, URL: c.path,
			}, &s)
			if err != nil {
				t.Fatal(err)
			}
			if s.resp == nil || s.resp.Status != c.status || !strings.Contains(string(s.resp.Body), c.want) {
				t.Fatalf("got %+v; want %d containing %s", s.resp, c.status, c.want)
			}
			if c.status == 200 && !json.Valid(s.resp.Body) {
				t.Fatalf("not JSON: %s", s.resp.Body)
			}
		})
	}
}
