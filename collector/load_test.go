package collector_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/collector/nvml"
	"github.com/deepseed/deepseed/store/storetest"
)

// BenchmarkCollectorLoad runs the real binary as its own process, sampling
// 8 fake GPUs at 1 Hz while a load generator posts 1,000 hook records/s
// to it, and forwards everything to a real ingest server and database. It
// reports the collector process's CPU (percent of one core) and RSS.
//
// The fake GPUs replay testdata/capture-h100-costs.json, a capture taken
// on an H100 with per-call costs recorded: each replayed NVML call spends
// the CPU and wall time the real call took there, so the figure is what
// the collector costs on real GPUs (collector/gpubench measures that on a
// GPU machine).
//
//	go test ./collector -run '^$' -bench CollectorLoad -benchtime 1x
//
// DEEPSEED_BENCH_SECONDS sets the measured duration (default 30);
// DEEPSEED_BENCH_GPUS the number of GPUs (default 8);
// DEEPSEED_BENCH_INTERVAL the sampling interval (default 1s);
// DEEPSEED_BENCH_HOOK_RECORDS the hook records a second (default 1000; 0
// for none, as collector/gpubench measures);
// DEEPSEED_BENCH_LOAD=1 replays testdata/capture-h100-load-costs.json
// instead, taken while a matmul loop ran on the GPU, with its process
// standing in for a training process announced by the hook on every GPU,
// so that they are sampled at the fast interval as under training;
// DEEPSEED_BENCH_FLAGS adds collect flags (such as --fast-interval 0);
// DEEPSEED_BENCH_BIN runs a prebuilt binary instead of building one.
func BenchmarkCollectorLoad(b *testing.B) {
	secs := 30
	if v, err := strconv.Atoi(os.Getenv("DEEPSEED_BENCH_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	gpus := envOr("DEEPSEED_BENCH_GPUS", "8")
	interval := envOr("DEEPSEED_BENCH_INTERVAL", "1s")
	hookRate := 1000
	if v, err := strconv.Atoi(os.Getenv("DEEPSEED_BENCH_HOOK_RECORDS")); err == nil && v >= 0 {
		hookRate = v
	}
	dir := b.TempDir()
	bin := filepath.Join(dir, "deepseed")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/deepseed").CombinedOutput(); err != nil {
		b.Fatalf("build: %v\n%s", err, out)
	}
	capture, holder := "testdata/capture-h100-costs.json", 0
	if os.Getenv("DEEPSEED_BENCH_LOAD") == "1" {
		capture, holder = loadCapture(b, dir)
	}
	st := storetest.NewStore(b)
	srv := newIngestServer(b, st).addr
	hookAddr := freeAddr(b)
	for i := 0; i < b.N; i++ {
		args := []string{"collect", "--fake-nvml", capture, "--fake-nvml-gpus", gpus,
			"--server", "http://" + srv, "--hook-listen", hookAddr, "--metrics-listen", "",
			"--spool-dir", filepath.Join(dir, "spool"), "--interval", interval, "--host-name", "bench", "--log-level", "warn"}
		args = append(args, strings.Fields(os.Getenv("DEEPSEED_BENCH_FLAGS"))...)
		cmd := exec.Command(envOr("DEEPSEED_BENCH_BIN", bin), args...)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		pid := cmd.Process.Pid
		url := "http://" + hookAddr + "/api/v1/ingest"
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if resp, err := http.Post(url, "application/x-ndjson", strings.NewReader(`{"kind":"event","run_id":"bench","type":"note","text":"start"}`)); err == nil {
				resp.Body.Close()
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("collector did not start")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if holder != 0 {
			body := fmt.Sprintf(`{"kind":"process","run_id":"bench","rank":0,"local_rank":0,"pid":%d}`, holder)
			resp, err := http.Post(url, "application/x-ndjson", strings.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
		}
		// Ten posts of hookRate/10 records each second, as a hook flushing
		// every 100 ms would send them.
		step := 0
		post := func() {
			if hookRate == 0 {
				return
			}
			var body bytes.Buffer
			for k := 0; k < hookRate/10; k++ {
				fmt.Fprintf(&body, `{"kind":"step","run_id":"bench","rank":%d,"step":%d,"time":%d.5,"loss":%g,"lr":0.0003,"grad_norm":1.25,"loss_scale":65536,"samples":%d,"step_ms":412.5,"forward_ms":120.1,"backward_ms":250.3,"optimizer_ms":30.2,"comm_ms":11.9,"throughput_sps":77.6,"gpu_util_pct":97,"gpu_mem_used_gb":61.2}`+"\n",
					k%8, step, 1795328221+step, 2.5/float64(step+1), 32*step)
				if k%8 == 7 {
					step++
				}
			}
			resp, err := http.Post(url, "application/x-ndjson", &body)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body) // drained, so the connection is reused as a keep-alive client would
			resp.Body.Close()
		}
		t0 := time.Now()
		warm := time.Now().Add(3 * time.Second)
		for time.Now().Before(warm) {
			post()
			time.Sleep(100 * time.Millisecond)
		}
		cpu0, _ := procCPU(pid)
		start := time.Now()
		tick := time.NewTicker(100 * time.Millisecond)
		for time.Since(start) < time.Duration(secs)*time.Second {
			<-tick.C
			post()
		}
		tick.Stop()
		cpu1, _ := procCPU(pid)
		wall := time.Since(start).Seconds()
		rss, hwm := procRSS(pid)
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
		cpuPct := 100 * (cpu1 - cpu0) / wall
		b.ReportMetric(cpuPct, "cpu%")
		b.ReportMetric(rss/(1<<20), "rss-MiB")
		b.ReportMetric(hwm/(1<<20), "peak-rss-MiB")
		b.ReportMetric(float64(step*8)/wall, "hook-records/s")
		var rows, gpuRows int
		storetest.Pool(b, st).QueryRow(b.Context(), `SELECT count(*) FROM steps WHERE run_id = 'bench'`).Scan(&rows)
		storetest.Pool(b, st).QueryRow(b.Context(), `SELECT count(*) FROM gpu_samples WHERE host = 'bench'`).Scan(&gpuRows)
		b.ReportMetric(float64(gpuRows)/time.Since(t0).Seconds(), "gpu-records/s")
		b.Logf("%ds, %s GPUs at %s: collector cpu %.2f%% of one core, rss %.1f MiB (peak %.1f), %d step rows stored", secs, gpus, interval, cpuPct, rss/(1<<20), hwm/(1<<20), rows)
	}
}

// loadCapture writes the capture taken under load into dir with its GPU
// process replaced by one started here (it must exist: the collector
// forgets an announced process whose PID has gone), and returns the
// file and that process's PID.
func loadCapture(b *testing.B, dir string) (string, int) {
	cp, err := nvml.LoadCapture("testdata/capture-h100-load-costs.json")
	if err != nil {
		b.Fatal(err)
	}
	hold := exec.Command("sleep", "3600")
	if err := hold.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { hold.Process.Kill(); hold.Wait() })
	pid := hold.Process.Pid
	for _, row := range cp.Samples {
		for d := range row {
			for k := range row[d].Processes {
				row[d].Processes[k].PID = uint32(pid)
			}
		}
	}
	out, err := json.Marshal(cp)
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(dir, "capture-load.json")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		b.Fatal(err)
	}
	return path, pid
}

func freeAddr(tb testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// procCPU is the CPU time pid has used, in seconds: the sum of its
// threads' schedstat run times (nanoseconds), which resolves the fraction
// of a percent a collector costs where utime+stime's 10 ms ticks do not;
// utime+stime where schedstat is missing.
func procCPU(pid int) (float64, error) {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var ns float64
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			v, _ := strconv.ParseFloat(f[0], 64)
			ns += v
		}
	}
	if ns > 0 {
		return ns / 1e9, nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	stt, _ := strconv.ParseFloat(f[12], 64)
	return (ut + stt) / 100, nil
}

func procRSS(pid int) (rss, hwm float64) {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		fs := strings.Fields(line)
		if len(fs) < 2 {
			continue
		}
		v, _ := strconv.ParseFloat(fs[1], 64)
		switch fs[0] {
		case "VmRSS:":
			rss = v * 1024
		case "VmHWM:":
			hwm = v * 1024
		}
	}
	return rss, hwm
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
