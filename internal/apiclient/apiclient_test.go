package apiclient_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/demo"
	"github.com/deepseed/deepseed/internal/apiclient"
	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

// TestClientIsGenerated generates the client from api/openapi.json with
// the generator go.mod names as a tool, and holds the committed client to
// it: the document generates a client, and the one the next test uses is
// that client.
func TestClientIsGenerated(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to run the generator: %v", err)
	}
	out := filepath.Join(t.TempDir(), "client.gen.go")
	cmd := exec.Command(goBin, "tool", "oapi-codegen", "-config", "oapi-codegen.yaml", "-o", out, "../../api/openapi.json")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("oapi-codegen on api/openapi.json: %v\n%s", err, msg)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("client.gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("internal/apiclient/client.gen.go is not what api/openapi.json generates: run go generate ./internal/apiclient")
	}
}

const (
	ingestToken = "ingest-token-0123456789"
	readToken   = "read-token-0123456789"
	submitToken = "submit-token-0123456789"
	agentToken  = "agent-token-0123456789"
)

func ptr[T any](v T) *T { return &v }

// response is what every generated response type has.
type response interface{ StatusCode() int }

// TestEveryGETThroughTheClient loads two demo runs through the generated
// client's ingest operation into a real server, then calls every GET
// operation the document describes through the client with a read token:
// each answers 2xx with a body the client decodes into the document's
// types, and with the data that was loaded. A GET added to the document
// and not called here fails the test.
func TestEveryGETThroughTheClient(t *testing.T) {
	cfg := server.DefaultConfig()
	cfg.IngestTokens, cfg.ReadTokens = []string{ingestToken}, []string{readToken}
	cfg.SubmitTokens, cfg.AgentTokens = []string{submitToken}, []string{"node1:" + agentToken}
	cfg.ShutdownTimeout = 30 * time.Second
	srv := server.New(cfg, storetest.NewStore(t), nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	base := "http://" + l.Addr().String()
	client := func(token string) *apiclient.ClientWithResponses {
		c, err := apiclient.NewClientWithResponses(base, apiclient.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+token)
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	writer, reader := client(ingestToken), client(readToken)
	submitter, agentC := client(submitToken), client(agentToken)

	called := map[string]bool{}
	// call checks one operation's answer: 2xx, and for JSON answers a
	// body decoded into the document's type.
	call := func(op string, res response, err error) {
		t.Helper()
		called[op] = true
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		body := reflect.ValueOf(res).Elem().FieldByName("Body").Bytes()
		if c := res.StatusCode(); c < 200 || c > 299 {
			t.Fatalf("%s: status %d: %s", op, c, body)
		}
		if f := reflect.ValueOf(res).Elem().FieldByName("JSON200"); f.IsValid() && f.IsNil() {
			t.Fatalf("%s: the client decoded no body from %s", op, body)
		}
	}

	waitReady(t, reader)
	ready, err := reader.GetReadinessWithResponse(ctx)
	call("getReadiness", ready, err)

	// Two demo runs: one with layers, evaluations, events, GPU samples
	// and a memory record, and one to compare it with.
	bert, pythia := "demo-bert-large-zero2-fp16-offload", "demo-pythia-160m-zero1"
	for _, r := range demo.Runs(time.Now()) {
		if r.ID != bert && r.ID != pythia {
			continue
		}
		var body bytes.Buffer
		recs := r.Records()
		for _, rec := range recs {
			b, err := json.Marshal(rec)
			if err != nil {
				t.Fatal(err)
			}
			body.Write(b)
			body.WriteByte('\n')
		}
		res, err := writer.IngestRecordsWithBodyWithResponse(ctx, &apiclient.IngestRecordsParams{}, "application/x-ndjson", &body)
		if err != nil || res.JSON200 == nil || *res.JSON200.Accepted != len(recs) {
			t.Fatalf("ingest %s: %v %s", r.ID, err, res.Body)
		}
	}

	health, err := reader.GetHealthWithResponse(ctx)
	call("getHealth", health, err)
	doc, err := reader.GetOpenApiDocumentWithResponse(ctx)
	call("getOpenApiDocument", doc, err)
	metrics, err := reader.GetMetricsWithResponse(ctx)
	call("getMetrics", metrics, err)
	if !bytes.Contains(metrics.Body, []byte("# TYPE deepseed_ingest_records_total counter")) {
		t.Errorf("getMetrics: no ingest counters in\n%s", metrics.Body)
	}

	runs, err := reader.ListRunsWithResponse(ctx, &apiclient.ListRunsParams{})
	call("listRuns", runs, err)
	if *runs.JSON200.Total != 2 {
		t.Errorf("listRuns: total %d, want the 2 runs loaded", *runs.JSON200.Total)
	}
	run, err := reader.GetRunWithResponse(ctx, bert)
	call("getRun", run, err)
	if *run.JSON200.RunId != bert {
		t.Errorf("getRun: run %s, want %s", *run.JSON200.RunId, bert)
	}

	// metric is optional: the series is the loss.
	series, err := reader.GetRunSeriesWithResponse(ctx, bert, &apiclient.GetRunSeriesParams{})
	call("getRunSeries", series, err)
	if s := *series.JSON200.Series; len(s) != 1 || *s[0].Metric != "loss" || len(*s[0].Points) == 0 {
		t.Errorf("getRunSeries without metric: %s, want the loss", series.Body)
	}
	all, metric := []string{"all"}, []string{"step_ms", "lr"}
	series, err = reader.GetRunSeriesWithResponse(ctx, bert, &apiclient.GetRunSeriesParams{Rank: &all, Metric: &metric})
	call("getRunSeries", series, err)
	if n := len(*series.JSON200.Series); n < 2 {
		t.Errorf("getRunSeries rank=all, two metrics: %d series", n)
	}

	heatmap, err := reader.GetRunHeatmapWithResponse(ctx, bert, &apiclient.GetRunHeatmapParams{})
	call("getRunHeatmap", heatmap, err)
	if len(*heatmap.JSON200.Layers) == 0 || len(*heatmap.JSON200.Values) == 0 {
		t.Errorf("getRunHeatmap: no layers or values: %s", heatmap.Body)
	}
	evals, err := reader.GetRunEvalsWithResponse(ctx, bert)
	call("getRunEvals", evals, err)
	if len(*evals.JSON200.Evals) == 0 {
		t.Errorf("getRunEvals: none")
	}
	breakdown, err := reader.GetRunBreakdownWithResponse(ctx, bert, &apiclient.GetRunBreakdownParams{})
	call("getRunBreakdown", breakdown, err)
	if len(*breakdown.JSON200.Parts) == 0 {
		t.Errorf("getRunBreakdown: no parts: %s", breakdown.Body)
	}
	memory, err := reader.GetRunMemoryWithResponse(ctx, bert)
	call("getRunMemory", memory, err)
	if memory.JSON200.Parts == nil || len(*memory.JSON200.Parts) == 0 {
		t.Errorf("getRunMemory: no parts: %s", memory.Body)
	}
	code, err := reader.GetRunCodeWithResponse(ctx, bert)
	call("getRunCode", code, err)
	if code.JSON200.Source == nil || !strings.Contains(*code.JSON200.Source, "deepspeed.initialize") || code.JSON200.GitDiff == nil {
		t.Errorf("getRunCode: no source or diff: %s", code.Body)
	}
	if missing, err := reader.GetRunCodeWithResponse(ctx, "no-such-run"); err != nil || missing.StatusCode() != http.StatusNotFound {
		t.Errorf("getRunCode of an unknown run: %v, status %d, want 404", err, missing.StatusCode())
	}
	ranks, err := reader.GetRunRanksWithResponse(ctx, bert, &apiclient.GetRunRanksParams{})
	call("getRunRanks", ranks, err)
	if len(*ranks.JSON200.Ranks) == 0 {
		t.Errorf("getRunRanks: none")
	}
	both := []string{bert, pythia}
	cmp, err := reader.CompareRunsWithResponse(ctx, &apiclient.CompareRunsParams{Run: &both, Baseline: &bert})
	call("compareRuns", cmp, err)
	if n := len(*cmp.JSON200.Rows); n != 2 {
		t.Errorf("compareRuns: %d rows, want 2", n)
	}
	gpus, err := reader.GetGpuSeriesWithResponse(ctx, &apiclient.GetGpuSeriesParams{RunId: &bert})
	call("getGpuSeries", gpus, err)
	if len(*gpus.JSON200.Series) == 0 {
		t.Errorf("getGpuSeries: no series for %s", bert)
	}
	ann, err := reader.ListAnnotationsWithResponse(ctx, &apiclient.ListAnnotationsParams{RunId: &bert})
	call("listAnnotations", ann, err)
	if len(*ann.JSON200.Annotations) == 0 {
		t.Errorf("listAnnotations: none for %s", bert)
	}
	open := apiclient.ListAlertsParamsStateOpen
	als, err := reader.ListAlertsWithResponse(ctx, &apiclient.ListAlertsParams{RunId: &bert, State: &open})
	call("listAlerts", als, err)
	if als.JSON200.Alerts == nil {
		t.Errorf("listAlerts: no alerts array for %s", bert)
	}

	// A job agent with two GPUs, a sweep of two trials, one claimed.
	hb, err := agentC.AgentHeartbeatWithResponse(ctx, "node1", apiclient.AgentHeartbeat{Executor: "local", Gpus: []int64{0, 1}, Running: []int64{}})
	if err != nil || hb.StatusCode() != http.StatusOK {
		t.Fatalf("agentHeartbeat: %v %s", err, hb.Body)
	}
	sw, err := submitter.CreateSweepWithResponse(ctx, apiclient.SweepCreate{Project: "imdb", Argv: []string{"python", "train.py", "--lr", "{lr}"},
		Params: map[string]string{"lr": "1e-5,2e-5"}})
	if err != nil || sw.JSON201 == nil || len(sw.JSON201.Trials) != 2 {
		t.Fatalf("createSweep: %v %s", err, sw.Body)
	}
	cl, err := agentC.ClaimJobWithResponse(ctx, "node1", apiclient.AgentClaim{FreeGpus: []int64{0, 1}, Executor: ptr("local")})
	if err != nil || cl.JSON200 == nil || cl.JSON200.Job == nil {
		t.Fatalf("claimJob: %v %s", err, cl.Body)
	}
	jobs, err := reader.ListJobsWithResponse(ctx, &apiclient.ListJobsParams{Project: ptr("imdb")})
	call("listJobs", jobs, err)
	if jobs.JSON200.Counts.Total != 2 || jobs.JSON200.Counts.Running != 1 {
		t.Errorf("listJobs: counts %+v, want 2 jobs, 1 running", jobs.JSON200.Counts)
	}
	job, err := reader.GetJobWithResponse(ctx, cl.JSON200.Job.Id)
	call("getJob", job, err)
	if job.JSON200.State != apiclient.JobStateRunning || len(*job.JSON200.GpuIds) != 1 {
		t.Errorf("getJob: %+v, want running on one GPU", job.JSON200)
	}
	swg, err := reader.GetSweepWithResponse(ctx, sw.JSON201.Id, &apiclient.GetSweepParams{Metric: ptr("val_accuracy")})
	call("getSweep", swg, err)
	if len(swg.JSON200.Trials) != 2 {
		t.Errorf("getSweep: %d trials, want 2", len(swg.JSON200.Trials))
	}
	sws, err := reader.ListSweepsWithResponse(ctx, &apiclient.ListSweepsParams{Project: ptr("imdb")})
	call("listSweeps", sws, err)
	if len(sws.JSON200.Sweeps) != 1 || sws.JSON200.Sweeps[0].Id != sw.JSON201.Id || sws.JSON200.Sweeps[0].Counts.Total != 2 {
		t.Errorf("listSweeps: %+v, want the one sweep of two trials", sws.JSON200.Sweeps)
	}
	ag, err := reader.ListAgentsWithResponse(ctx)
	call("listAgents", ag, err)
	if len(ag.JSON200.Agents) != 1 || !ag.JSON200.Agents[0].Alive {
		t.Errorf("listAgents: %+v, want node1 alive", ag.JSON200.Agents)
	}
	limit := 30.0
	if res, err := submitter.SetQuotaWithResponse(ctx, "imdb", apiclient.QuotaSet{GpuHours: &limit}); err != nil || res.StatusCode() != http.StatusOK {
		t.Fatalf("setQuota: %v %s", err, res.Body)
	}
	qs, err := reader.ListQuotasWithResponse(ctx)
	call("listQuotas", qs, err)
	q, err := reader.GetQuotaWithResponse(ctx, "imdb")
	call("getQuota", q, err)
	if len(qs.JSON200.Quotas) != 1 || q.JSON200.GpuHours == nil || *q.JSON200.GpuHours != 30 || q.JSON200.Exceeded {
		t.Errorf("quotas: %+v and %+v, want imdb at 30 GPU-hours, not exceeded", qs.JSON200.Quotas, q.JSON200)
	}

	for _, op := range getOperations(t) {
		if !called[op] {
			t.Errorf("GET operation %s is in api/openapi.json but this test does not call it", op)
		}
	}
}

// getOperations lists the operationId of every GET in the document.
func getOperations(t *testing.T) []string {
	t.Helper()
	var doc struct {
		Paths map[string]map[string]struct {
			OperationID string `json:"operationId"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	var ops []string
	for path, methods := range doc.Paths {
		for method, op := range methods {
			if op.OperationID == "" {
				t.Errorf("%s %s has no operationId", strings.ToUpper(method), path)
			}
			if method == "get" {
				ops = append(ops, op.OperationID)
			}
		}
	}
	slices.Sort(ops)
	if len(ops) < 15 {
		t.Fatalf("only %d GET operations in the document", len(ops))
	}
	return ops
}

// waitReady waits until the server has migrated its database.
func waitReady(t *testing.T, c *apiclient.ClientWithResponses) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := c.GetReadinessWithResponse(context.Background())
		if err == nil && res.StatusCode() == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not ready: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
