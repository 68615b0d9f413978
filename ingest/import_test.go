package ingest_test

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/store/storetest"
)

func TestImportSeedExport(t *testing.T) {
	s := newServer(t, ingest.Options{})
	body, err := os.ReadFile("testdata/training_metrics.json")
	if err != nil {
		t.Fatal(err)
	}
	res := s.post(t, "/api/v1/import?project=imdb&name=bert-zero2", gz(t, body), "Content-Encoding", "gzip").result(t)
	if len(res.RunIDs) != 1 || res.RunIDs[0] != ingest.ExportRunID(body) {
		t.Fatalf("run ids = %v, want the export's hash id", res.RunIDs)
	}
	// run + 20 steps + 20 layers + 2 evals + memory + end
	if res.Accepted != 45 || res.Duplicates != 0 {
		t.Fatalf("result = %+v", res)
	}
	id := res.RunIDs[0]
	ctx := context.Background()

	var project, name, status, meta, summary string
	var layerNames []string
	var started, ended time.Time
	err = storetest.Pool(t, s.Store).QueryRow(ctx, `SELECT project, name, status, meta::text, summary::text, layer_names, started_at, ended_at
		FROM runs WHERE run_id = $1`, id).Scan(&project, &name, &status, &meta, &summary, &layerNames, &started, &ended)
	if err != nil {
		t.Fatal(err)
	}
	if project != "imdb" || name != "bert-zero2" || status != "finished" {
		t.Fatalf("project=%q name=%q status=%q", project, name, status)
	}
	var m map[string]any
	_ = json.Unmarshal([]byte(meta), &m)
	for k, want := range map[string]any{"model": "bert-large-uncased", "params": 335141890.0, "gpu": "Tesla T4", "zero_stage": 2.0,
		"precision": "fp16", "micro_batch": 4.0, "grad_accum": 4.0, "effective_batch": 16.0, "epochs": 3.0,
		"offload_optimizer": "cpu", "gpu_memory_total_gb": 15.8, "final_accuracy": 0.931} {
		if m[k] != want {
			t.Errorf("meta.%s = %v, want %v (meta %s)", k, m[k], want, meta)
		}
	}
	if !strings.Contains(summary, `"final_f1": 0.928`) {
		t.Errorf("summary = %s", summary)
	}
	if len(layerNames) != 26 || layerNames[0] != "embeddings" || layerNames[1] != "encoder.0" || layerNames[24] != "encoder.23" || layerNames[25] != "classifier" {
		t.Fatalf("layer_names = %v, want embeddings, encoder.0..23, classifier in model order", layerNames)
	}
	// The steps carry Unix timestamps: the run starts at the first.
	if !started.Equal(time.Date(2025, 1, 1, 10, 0, 0, 0, time.UTC)) || ended.Before(started) {
		t.Fatalf("started_at %v ended_at %v", started, ended)
	}

	var steps, layerRows, evals int
	var fwdEmb, bwdCls, gradNaN float64
	err = storetest.Pool(t, s.Store).QueryRow(ctx, `SELECT (SELECT count(*) FROM steps WHERE run_id = $1),
		(SELECT count(*) FROM layer_times WHERE run_id = $1 AND array_length(forward_ms, 1) = 26 AND array_length(backward_ms, 1) = 26),
		(SELECT count(*) FROM evals WHERE run_id = $1),
		(SELECT forward_ms[1] FROM layer_times WHERE run_id = $1 AND step = 0),
		(SELECT backward_ms[26] FROM layer_times WHERE run_id = $1 AND step = 0),
		(SELECT grad_norm FROM steps WHERE run_id = $1 AND step = 35)`, id).Scan(&steps, &layerRows, &evals, &fwdEmb, &bwdCls, &gradNaN)
	if err != nil {
		t.Fatal(err)
	}
	if steps != 20 || layerRows != 20 || evals != 2 {
		t.Fatalf("steps=%d layer rows=%d evals=%d, want 20, 20, 2", steps, layerRows, evals)
	}
	if fwdEmb < 1.3 || fwdEmb > 1.7 || bwdCls < 0.5 || bwdCls > 1.0 || !math.IsNaN(gradNaN) {
		t.Fatalf("embeddings fwd %v, classifier bwd %v, overflow grad_norm %v", fwdEmb, bwdCls, gradNaN)
	}
	// Both spellings of the evaluation fields land in the same columns.
	var accs string
	if err := storetest.Pool(t, s.Store).QueryRow(ctx, `SELECT string_agg(format('%s:%s/%s/%s', step, loss, accuracy, f1), ' ' ORDER BY step) FROM evals WHERE run_id = $1`, id).Scan(&accs); err != nil {
		t.Fatal(err)
	}
	if accs != "50:0.412/0.842/0.836 95:0.281/0.931/0.928" {
		t.Fatalf("evals = %s", accs)
	}
	var optDev string
	var optBytes, params float64
	if err := storetest.Pool(t, s.Store).QueryRow(ctx, `SELECT optimizer_device, optimizer_bytes, parameters_bytes FROM memory_breakdowns WHERE run_id = $1`, id).Scan(&optDev, &optBytes, &params); err != nil {
		t.Fatal(err)
	}
	if optDev != "cpu" || math.Abs(optBytes-4.022e9) > 1 || math.Abs(params-0.67e9) > 1 {
		t.Fatalf("memory: optimizer %v bytes on %s, parameters %v", optBytes, optDev, params)
	}

	// Importing the same file again stores nothing new.
	again := s.post(t, "/api/v1/import?project=imdb&name=bert-zero2", body).result(t)
	if again.RunIDs[0] != id || again.Duplicates != 43 {
		t.Fatalf("re-import = %+v, want 43 duplicates on %s", again, id)
	}
	if n := s.count(t, `SELECT count(*) FROM steps`); n != 20 {
		t.Fatalf("re-import left %d steps", n)
	}
}

// Exports without step times, with the other field spellings the seed
// notebook has used.
func TestImportVariants(t *testing.T) {
	s := newServer(t, ingest.Options{})
	body := `{"meta":{"model":"gpt2","fp16":false,"total_time_minutes":10},
		"steps":[
			{"step":0,"loss":NaN,"data_load_ms":4,"layer_times":{"wte":1.0,"h.0":2.0,"lm_head":0.5},"my_metric":3},
			{"step":10,"loss":2.0,"layer_times":{"wte":{"forward_ms":1.1,"backward_ms":2.2},"h.0":{"forward_ms":2.1,"backward_ms":4.2},"lm_head":{"forward_ms":0.6,"backward_ms":1.2}}}],
		"evaluations":[{"step":10,"loss":1.9,"accuracy":0.3}],
		"zero_memory":{"parameters_gb":0.25,"gradients_gb":0.25,"optimizer_gb":1.5,"activations_gb":0.1}}`
	res := s.post(t, "/api/v1/import?run_id=gpt2-a", []byte(body)).result(t)
	if res.RunIDs[0] != "gpt2-a" || res.Accepted != 8 {
		t.Fatalf("result = %+v", res)
	}
	ctx := context.Background()
	var started, t10 time.Time
	var dataMS float64
	var metrics, fwd0, bwd0, fwd10, bwd10, dev, precision string
	err := storetest.Pool(t, s.Store).QueryRow(ctx, `SELECT r.started_at, r.meta->>'precision',
		(SELECT time FROM steps WHERE step = 10), (SELECT data_ms FROM steps WHERE step = 0), (SELECT metrics::text FROM steps WHERE step = 0),
		(SELECT forward_ms::text FROM layer_times WHERE step = 0), (SELECT coalesce(backward_ms::text, 'null') FROM layer_times WHERE step = 0),
		(SELECT forward_ms::text FROM layer_times WHERE step = 10), (SELECT backward_ms::text FROM layer_times WHERE step = 10),
		(SELECT optimizer_device FROM memory_breakdowns)
		FROM runs r`).Scan(&started, &precision, &t10, &dataMS, &metrics, &fwd0, &bwd0, &fwd10, &bwd10, &dev)
	if err != nil {
		t.Fatal(err)
	}
	if precision != "fp32" || dataMS != 4 || metrics != `{"my_metric": 3}` || dev != "gpu" {
		t.Fatalf("precision=%s data_ms=%v metrics=%s optimizer_device=%s", precision, dataMS, metrics, dev)
	}
	if fwd0 != "{1,2,0.5}" || bwd0 != "null" || fwd10 != "{1.1,2.1,0.6}" || bwd10 != "{2.2,4.2,1.2}" {
		t.Fatalf("layers: step 0 %s/%s, step 10 %s/%s", fwd0, bwd0, fwd10, bwd10)
	}
	// No times in the export: the steps spread over total_time_minutes.
	if d := t10.Sub(started); d != 10*time.Minute {
		t.Fatalf("step 10 is %v after the start, want 10m", d)
	}
	// A re-import lands on the same times, so it changes nothing.
	again := s.post(t, "/api/v1/import?run_id=gpt2-a", []byte(body)).result(t)
	if again.Duplicates != 6 {
		t.Fatalf("re-import = %+v, want 6 duplicates", again)
	}
}

func TestImportRejectsBadExport(t *testing.T) {
	cases := map[string]string{
		"not json":       `{"steps": [`,
		"no steps":       `{"meta": {"model": "x"}}`,
		"string loss":    `{"steps": [{"step": 1, "loss": "high"}]}`,
		"negative step":  `{"steps": [{"step": -3, "loss": 1}]}`,
		"bad layer":      `{"steps": [{"step": 1, "layer_times": {"a": "slow"}}]}`,
		"eval no step":   `{"steps": [{"step": 1}], "evaluations": [{"val_loss": 1}]}`,
		"bad zero stage": `{"meta": {"zero_stage": 7}, "steps": [{"step": 1}]}`,
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			s := newServer(t, ingest.Options{})
			e := s.post(t, "/api/v1/import", []byte(body)).apiError(t, http.StatusBadRequest)
			if !strings.Contains(e.Error, "nothing stored") {
				t.Fatalf("error = %s", e.Error)
			}
			if n := s.stored(t); n != 0 {
				t.Fatalf("a rejected export stored %d rows", n)
			}
		})
	}
}

// Importing the same export into another project would move the run (its
// id comes from the contents): refused with 409, the run stays where it
// is. Without a project, or with its own, a re-import is fine; another
// run_id stores a second run in the new project.
func TestReimportIntoAnotherProjectIsRefused(t *testing.T) {
	s := newServer(t, ingest.Options{})
	body, err := os.ReadFile("testdata/training_metrics.json")
	if err != nil {
		t.Fatal(err)
	}
	id := s.post(t, "/api/v1/import?project=imdb", body).result(t).RunIDs[0]
	e := s.post(t, "/api/v1/import?project=sst2", body).apiError(t, http.StatusConflict)
	if !strings.Contains(e.Error, `already stored in project "imdb"`) || !strings.Contains(e.Error, "nothing stored") {
		t.Errorf("error = %q, want the project the run is in", e.Error)
	}
	project := func(run string) string {
		var p string
		if err := storetest.Pool(t, s.Store).QueryRow(context.Background(), `SELECT project FROM runs WHERE run_id = $1`, run).Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := project(id); p != "imdb" {
		t.Fatalf("after the refused import the run is in %q, want imdb", p)
	}
	for _, q := range []string{"", "?project=imdb"} {
		if res := s.post(t, "/api/v1/import"+q, body).result(t); res.RunIDs[0] != id {
			t.Fatalf("re-import %q: run ids %v", q, res.RunIDs)
		}
		if p := project(id); p != "imdb" {
			t.Fatalf("re-import %q moved the run to %q", q, p)
		}
	}
	second := s.post(t, "/api/v1/import?project=sst2&run_id=bert-in-sst2", body).result(t)
	if second.RunIDs[0] != "bert-in-sst2" || project("bert-in-sst2") != "sst2" || project(id) != "imdb" {
		t.Fatalf("import with another run_id: %+v", second)
	}
}

// Offload reads as the hook writes it from a DeepSpeed config: "none"
// where nothing is offloaded, never "" for an import.
func TestImportOffloadSaysNone(t *testing.T) {
	s := newServer(t, ingest.Options{})
	seed, err := os.ReadFile("testdata/training_metrics.json")
	if err != nil {
		t.Fatal(err)
	}
	for body, want := range map[string][2]string{
		string(seed): {"cpu", "none"},
		`{"meta": {"model": "m", "zero_stage": 2}, "steps": [{"step": 1, "loss": 1}], "zero_memory": {"optimizer_gb": 2.5}}`: {"none", "none"},
		`{"meta": {"model": "m"}, "steps": [{"step": 1, "loss": 1}], "zero_memory": {"optimizer_nvme_gb": 2.5}}`:             {"nvme", "none"},
		`{"steps": [{"step": 1, "loss": 1}]}`: {"none", "none"},
	} {
		id := s.post(t, "/api/v1/import", []byte(body)).result(t).RunIDs[0]
		var optim, params *string
		if err := storetest.Pool(t, s.Store).QueryRow(context.Background(),
			`SELECT meta->>'offload_optimizer', meta->>'offload_params' FROM runs WHERE run_id = $1`, id).Scan(&optim, &params); err != nil {
			t.Fatal(err)
		}
		if optim == nil || params == nil || *optim != want[0] || *params != want[1] {
			t.Errorf("%.60s…: offload_optimizer %v, offload_params %v; want %q, %q", body, deref(optim), deref(params), want[0], want[1])
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "<absent>"
	}
	return *s
}

// An export without step times gets them from its timestamps (the wall
// clock between logged steps, per step) or, without timestamps, from the
// sum of its phase times; throughput follows from samples, tokens or the
// run's effective batch.
func TestImportDerivesStepTimeAndThroughput(t *testing.T) {
	s := newServer(t, ingest.Options{})
	clock := `{"meta":{"model":"m","batch_sizes":{"micro":4,"grad_accum":4,"effective":16}},
		"steps":[
			{"step":0,"loss":1,"timestamp":1735725600.0},
			{"step":5,"loss":1,"timestamp":1735725602.75,"tokens":8192},
			{"step":10,"loss":1,"timestamp":1735725604.0,"samples":32},
			{"step":15,"loss":1,"timestamp":1735725606.0,"step_ms":123,"throughput_sps":9}]}`
	s.post(t, "/api/v1/import?run_id=clock", []byte(clock)).result(t)
	phases := `{"meta":{"model":"m"},
		"steps":[
			{"step":0,"loss":1,"forward_ms":10,"backward_ms":20,"optimizer_ms":5,"data_ms":5,"comm_ms":50,"samples":8},
			{"step":1,"loss":1}]}`
	s.post(t, "/api/v1/import?run_id=phases", []byte(phases)).result(t)

	got := map[string]string{}
	rows, err := storetest.Pool(t, s.Store).Query(context.Background(), `SELECT run_id || ':' || step,
		format('%s/%s/%s', coalesce(step_ms::text, '-'), coalesce(round(throughput_sps::numeric, 3)::text, '-'), coalesce(round(throughput_tps::numeric, 1)::text, '-'))
		FROM steps ORDER BY run_id, step`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		got[k] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		// 2.75 s over the first five steps, used for step 0 too; then
		// 1.25 s and 2 s over five.
		"clock:0":  "550/29.091/-",
		"clock:5":  "550/29.091/14894.5",
		"clock:10": "250/128.000/-",
		"clock:15": "123/9.000/-", // given: kept
		// 10+20+5+5 ms; communication overlaps backward and is left out.
		"phases:0": "40/200.000/-",
		"phases:1": "-/-/-", // nothing to derive from
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %s, want %s", k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("steps = %v", got)
	}
}
