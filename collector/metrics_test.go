package collector_test

import (
	"bytes"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/collector"
	"github.com/deepseed/deepseed/collector/nvml"
	"github.com/deepseed/deepseed/store/storetest"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

// fakeClock steps one second each time it is read after Advance.
type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time          { return c.t }
func (c *fakeClock) Advance(d time.Duration) { c.t = c.t.Add(d) }

// copyDir copies a fixture tree into dst, replacing files there.
func copyDir(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if fi.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func mustCapture(t testing.TB) nvml.Capture {
	t.Helper()
	c, err := nvml.LoadCapture("testdata/capture-h100.json")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func post(t *testing.T, h http.Handler, method, path, encoding, body string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if encoding != "" {
		req.Header.Set("Content-Encoding", encoding)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

// TestMetricsGolden replays two loaded ticks of the H100 capture on two
// GPUs, with a fixture /proc that holds the announced training process,
// and compares the whole /metrics page with testdata/metrics.golden.
func TestMetricsGolden(t *testing.T) {
	proc := t.TempDir()
	copyDir(t, "testdata/proc", proc)
	clock := &fakeClock{t: time.Date(2026, 11, 22, 6, 17, 1, 0, time.UTC)}
	fake := nvml.NewFake(mustCapture(t), 2)
	fake.Seek(30)
	c, err := collector.New(collector.Config{
		SpoolDir: t.TempDir(), HostName: "gpu-node-1", DCGMCompat: true,
		ProcRoot: proc, NVML: fake, Now: clock.Now, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	code, body := post(t, c, "POST", "/api/v1/ingest", "", `{"kind":"process","run_id":"gpu-check","rank":0,"local_rank":0,"pid":422}`)
	if code != 200 {
		t.Fatalf("announce: %d %s", code, body)
	}
	c.SampleOnce()
	clock.Advance(time.Second)
	copyDir(t, "testdata/proc-later", proc)
	c.SampleOnce()

	var buf bytes.Buffer
	c.WriteMetrics(&buf)
	golden := "testdata/metrics.golden"
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got := buf.String(); got != string(want) {
		t.Errorf("/metrics differs from %s (run with -update after checking):\n%s", golden, lineDiff(string(want), got))
	}
}

func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < len(w) || i < len(g); i++ {
		var a, c string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			c = g[i]
		}
		if a != c {
			b.WriteString("- " + a + "\n+ " + c + "\n")
		}
	}
	return b.String()
}

// TestNoNVML: without the library the collector still samples the host
// and says GPU sampling is down.
func TestNoNVML(t *testing.T) {
	fake := nvml.NewFake(mustCapture(t), 1)
	fake.InitErr = nvml.ErrNoLibrary
	c, err := collector.New(collector.Config{SpoolDir: t.TempDir(), HostName: "h", ProcRoot: "testdata/proc", NVML: fake, DCGMCompat: true})
	if err != nil {
		t.Fatal(err)
	}
	c.SampleOnce()
	var buf bytes.Buffer
	c.WriteMetrics(&buf)
	out := buf.String()
	for _, want := range []string{"deepseed_gpu_sampling_up 0\n", "deepseed_host_sampling_up 1\n", `deepseed_host_memory_total_bytes{host="h"} 1.35148544e+11`} {
		if !strings.Contains(out, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "DCGM_FI_") {
		t.Errorf("DCGM metrics without a GPU:\n%s", out)
	}
}

// TestMIGLabels: a MIG instance carries dcgm-exporter's GPU_I_PROFILE and
// GPU_I_ID labels and its parent's UUID.
func TestMIGLabels(t *testing.T) {
	cp := mustCapture(t)
	parent := cp.Devices[0]
	mig := parent
	mig.UUID = "MIG-0f3e0cd4-6d1c-5a7e-9a51-1f2d3c4b5a69"
	mig.Name = parent.Name + " MIG 1g.10gb"
	mig.MIG = &nvml.MIGInfo{ParentUUID: parent.UUID, GPUInstanceID: 9, Profile: "1g.10gb"}
	cp.Devices = []nvml.DeviceInfo{mig}
	for i := range cp.Samples {
		cp.Samples[i] = cp.Samples[i][:1]
	}
	c, err := collector.New(collector.Config{SpoolDir: t.TempDir(), HostName: "h", ProcRoot: "testdata/proc", NVML: nvml.NewFake(cp, 0), DCGMCompat: true})
	if err != nil {
		t.Fatal(err)
	}
	c.SampleOnce()
	var buf bytes.Buffer
	c.WriteMetrics(&buf)
	want := `DCGM_FI_DEV_FB_USED{gpu="0",UUID="` + parent.UUID + `",pci_bus_id="00000000:00:06.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3 MIG 1g.10gb",GPU_I_PROFILE="1g.10gb",GPU_I_ID="9",Hostname="h"} 0`
	if !strings.Contains(buf.String(), want) {
		t.Errorf("/metrics lacks\n%s\n%s", want, buf.String())
	}
}
