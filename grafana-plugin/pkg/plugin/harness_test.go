package plugin

import (
	"flag"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
	"github.com/grafana/grafana-plugin-sdk-go/experimental/datasourcetest"

	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/server/servertest"
	"github.com/deepseed/deepseed/store/storetest"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

const (
	ingestToken = "plugin-test-ingest-token"
	readToken   = "plugin-test-read-token"
)

// t0 is the start of the test runs; every record time is fixed, so the
// frames (and golden files) are the same on every run.
var t0 = time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)

// startServer runs a real DeepSeed server (ingest and query, token auth)
// on a fresh database and returns its URL once it is ready.
func startServer(t *testing.T) string {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.IngestTokens = []string{ingestToken}
	cfg.ReadTokens = []string{readToken}
	return servertest.Start(t, cfg, storetest.NewStore(t))
}

// ingest posts NDJSON records to the server with the ingest token and
// waits until the rollups of their runs are refreshed: the views answer at
// once whatever the backlog, with the figures rolled up so far, and the
// golden answers are those of runs rolled up whole, as a user sees them a
// moment after the last step.
func ingest(t *testing.T, base string, records []map[string]any) {
	t.Helper()
	servertest.Ingest(t, base, ingestToken, records)
	seen := map[string]bool{}
	for _, r := range records {
		if id, ok := r["run_id"].(string); ok && r["kind"] == "run" && !seen[id] {
			seen[id] = true
			servertest.WaitRollups(t, base, readToken, id)
		}
	}
}

func ts(d time.Duration) string { return t0.Add(d).Format(time.RFC3339Nano) }

// fixtureRecords is a small deterministic training: run "bert-z2" (2
// ranks, 20 steps, 3 layers, an fp16 overflow with a NaN loss at step 7,
// evals at steps 10 and 20, two GPUs of one host, a checkpoint) and run
// "bert-z3" to compare it with.
func fixtureRecords() []map[string]any {
	var recs []map[string]any
	for i, run := range []struct {
		id    string
		zero  int
		speed float64
	}{{"bert-z2", 2, 1}, {"bert-z3", 3, 1.25}} {
		recs = append(recs, map[string]any{
			"kind": "run", "run_id": run.id, "project": "nlp", "name": fmt.Sprintf("BERT ZeRO-%d", run.zero),
			"started_at": ts(0), "tags": []string{"bert", "test"}, "sweep_id": "zero-sweep",
			"config": map[string]any{"train_micro_batch_size_per_gpu": 4, "zero_optimization": map[string]any{"stage": run.zero}},
			"params": map[string]any{"lr": 2e-5, "warmup": 150},
			"meta": map[string]any{"model": "bert-large", "params": 335000000, "gpu": "Tesla T4", "zero_stage": run.zero,
				"precision": "fp16", "world_size": 2, "micro_batch": 4, "grad_accum": 4, "offload_optimizer": "cpu",
				"command": "deepspeed train.py --deepspeed ds.json", "git_commit": "abc1234", "host": "node-a",
				"versions": map[string]string{"torch": "2.3.0", "deepspeed": "0.14.2"}},
			"code": map[string]any{"entry_path": "/work/train.py", "source": "import deepseed\nrun = deepseed.init()\n",
				"source_bytes": 36, "git_diff": "-lr: 1\n+lr: 2\n", "git_diff_bytes": 900000, "git_diff_truncated": true},
		})
		for step := 1; step <= 20; step++ {
			for rank := 0; rank < 2; rank++ {
				at := time.Duration(step) * time.Second
				stepMS := (100 + float64(rank)*10 + float64(step%3)) * run.speed
				var loss any = 2.0 - float64(step)*0.05 - float64(rank)*0.01
				if step == 7 && i == 0 {
					loss = "NaN"
				}
				recs = append(recs, map[string]any{
					"kind": "step", "run_id": run.id, "rank": rank, "step": step, "time": ts(at), "loss": loss,
					"lr": 1e-5 * float64(step), "grad_norm": 1 + float64(step%4)*0.25, "loss_scale": 65536,
					"skipped": step == 7 && i == 0, "samples": 16, "throughput_sps": 160 / run.speed,
					"step_ms": stepMS, "forward_ms": 30 * run.speed, "backward_ms": 50 * run.speed, "optimizer_ms": 10 * run.speed,
					"comm_ms": 5, "data_ms": 3, "gpu_util_pct": 80 + float64(rank), "gpu_mem_used_gb": 10 + float64(step)*0.1,
					"tflops": 12 / run.speed, "mfu": 0.2 / run.speed,
					"metrics": map[string]any{"tokens_seen": step * 1024},
				})
				if rank == 0 {
					recs = append(recs, map[string]any{
						"kind": "layers", "run_id": run.id, "rank": 0, "step": step, "time": ts(at),
						"names":       []string{"embeddings", "encoder.0", "pooler"},
						"forward_ms":  []float64{1 + float64(step%2), 10 + float64(step%5), 0.5},
						"backward_ms": []float64{2, 20 + float64(step%5), 1},
					})
				}
			}
		}
		for _, step := range []int{10, 20} {
			recs = append(recs, map[string]any{
				"kind": "eval", "run_id": run.id, "step": step, "time": ts(time.Duration(step)*time.Second + 500*time.Millisecond),
				"split": "val", "loss": 1.5 - float64(step)*0.02, "accuracy": 0.5 + float64(step)*0.02, "f1": 0.45 + float64(step)*0.02,
			})
		}
		recs = append(recs,
			map[string]any{"kind": "memory", "run_id": run.id, "rank": 0, "parameters_bytes": 670e6, "gradients_bytes": 335e6,
				"optimizer_bytes": 4020e6, "optimizer_device": "cpu", "activations_bytes": 2e9},
			map[string]any{"kind": "event", "run_id": run.id, "time": ts(10 * time.Second), "step": 10, "type": "checkpoint",
				"text": "saved global_step10"},
			map[string]any{"kind": "end", "run_id": run.id, "time": ts(21 * time.Second), "status": "finished"},
		)
	}
	for sec := 0; sec < 20; sec++ {
		for gpu := 0; gpu < 2; gpu++ {
			recs = append(recs, map[string]any{
				"kind": "gpu", "time": ts(time.Duration(sec) * time.Second), "host": "node-a", "gpu": gpu,
				"uuid": fmt.Sprintf("GPU-%d", gpu), "name": "Tesla T4", "run_id": "bert-z2", "rank": gpu,
				"util_pct": 70 + float64(sec%5) + float64(gpu), "mem_used_bytes": 12e9, "mem_total_bytes": 16e9,
				"power_w": 60 + float64(gpu), "temp_c": 65,
			})
		}
	}
	return recs
}

var (
	pluginOnce sync.Once
	pluginTP   datasourcetest.TestPlugin
	pluginErr  error
)

// startPlugin serves the data source through the SDK's gRPC test harness,
// as Grafana would talk to it. The SDK registers process-wide metrics, so
// one harness serves every test of the package; tests keep their data
// source instances apart by UID.
func startPlugin(t *testing.T) datasourcetest.TestPlugin {
	t.Helper()
	pluginOnce.Do(func() {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			pluginErr = err
			return
		}
		addr := l.Addr().String()
		l.Close()
		pluginTP, pluginErr = datasourcetest.Manage(NewDatasource, datasourcetest.ManageOpts{Address: addr})
	})
	if pluginErr != nil {
		t.Fatalf("start plugin harness: %v", pluginErr)
	}
	return pluginTP
}

// pluginContext is what Grafana sends with each call for a data source
// configured with url and token; uid keeps instances with different
// settings apart.
func pluginContext(uid, url, token string) backend.PluginContext {
	secure := map[string]string{}
	if token != "" {
		secure["token"] = token
	}
	return backend.PluginContext{
		PluginID: PluginID,
		DataSourceInstanceSettings: &backend.DataSourceInstanceSettings{
			UID: uid, Name: "DeepSeed " + uid, Updated: t0,
			JSONData:                []byte(fmt.Sprintf(`{"url":%q}`, url)),
			DecryptedSecureJSONData: secure,
		},
	}
}
