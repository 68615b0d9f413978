package deploy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(storetest.Main(m)) }

// TestServerRunsAsComposed runs the deepseed binary the way the compose
// file does: the deepseed service's command and environment, with only
// the database URL pointed at a test database and the port at a free
// one. Then the healthcheck's URL must answer, and the tokens of .env
// must be accepted for what the loader, collector and Grafana do.
func TestServerRunsAsComposed(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the server")
	}
	bin := filepath.Join(t.TempDir(), "deepseed")
	build := exec.Command("go", "build", "-o", bin, "./cmd/deepseed")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	p := loadProject(t)
	svc := service(t, p, "deepseed")
	addr := freeAddr(t)
	envv := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	for k, v := range svc.Environment {
		switch {
		case v == nil:
		case k == "DEEPSEED_DATABASE_URL":
			envv = append(envv, k+"="+storetest.NewDatabase(t))
		case k == "DEEPSEED_LISTEN":
			envv = append(envv, k+"="+addr)
		default:
			envv = append(envv, k+"="+*v)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, svc.Command...)
	cmd.Env = envv
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("server output:\n%s", logs.String())
		}
	}()

	base := "http://" + addr
	// The compose healthcheck: curl -fsS http://127.0.0.1:8080/readyz,
	// retried; here with the same retries and interval.
	hc := svc.HealthCheck
	ready := false
	for i := 0; i <= int(*hc.Retries) && !ready; i++ {
		if resp, err := http.Get(base + "/readyz"); err == nil {
			resp.Body.Close()
			ready = resp.StatusCode == http.StatusOK
		}
		if !ready {
			time.Sleep(time.Duration(*hc.Interval))
		}
	}
	if !ready {
		t.Fatalf("%s/readyz never answered 200", base)
	}

	dot := dotEnv(t)
	for _, c := range []struct {
		who, method, path, token string
		want                     int
	}{
		{"grafana data source", "GET", "/api/v1/runs", dot["DEEPSEED_READ_TOKEN"], http.StatusOK},
		{"demo loader", "GET", "/api/v1/runs", dot["DEEPSEED_INGEST_TOKEN"], http.StatusOK},
		{"anyone", "GET", "/api/v1/runs", "", http.StatusUnauthorized},
		// .env's submit and agent tokens reach the server: the job routes
		// take them (an empty JSON body is a bad request, not a refusal).
		{"job submitter", "POST", "/api/v1/jobs", dot["DEEPSEED_SUBMIT_TOKEN"], http.StatusBadRequest},
		{"demo loader", "POST", "/api/v1/jobs", dot["DEEPSEED_INGEST_TOKEN"], http.StatusForbidden},
		{"agent", "GET", "/api/v1/jobs", dot["DEEPSEED_AGENT_TOKEN"], http.StatusOK},
		{"grafana data source", "POST", "/api/v1/ingest", dot["DEEPSEED_READ_TOKEN"], http.StatusForbidden},
	} {
		req, _ := http.NewRequest(c.method, base+c.path, strings.NewReader("[]"))
		req.Header.Set("Content-Type", "application/json")
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s: %s %s: %d, want %d", c.who, c.method, c.path, resp.StatusCode, c.want)
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprintf("127.0.0.1:%d", l.Addr().(*net.TCPAddr).Port)
}
