package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store/storetest"
)

// binDir holds the deepseed binary built once for the package's tests.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "deepseed-bin-")
	if err != nil {
		panic(err)
	}
	binDir = dir
	code := storetest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

const testVersion = "1.2.3-test"

var (
	buildOnce sync.Once
	buildErr  error
)

// binary builds the deepseed binary (once) and returns its path.
func binary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("DEEPSEED_TEST_BINARY"); bin != "" {
		return bin
	}
	bin := filepath.Join(binDir, "deepseed")
	buildOnce.Do(func() {
		out, err := exec.Command("go", "build", "-ldflags", "-X main.Version="+testVersion, "-o", bin, ".").CombinedOutput()
		if err != nil {
			buildErr = err
			t.Logf("go build: %s", out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build deepseed: %v", buildErr)
	}
	return bin
}

// runBinary runs deepseed with args and a clean DEEPSEED_ environment plus
// env, and returns its exit code, stdout and stderr.
func runBinary(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	cmd.Env = append(cleanEnv(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run deepseed %v: %v", args, err)
	}
	return code, stdout.String(), stderr.String()
}

// cleanEnv is the environment without DEEPSEED_ variables, so a
// developer's settings do not leak into the tests.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DEEPSEED_") || strings.HasPrefix(kv, "DEEPSEED_PG_BIN=") {
			env = append(env, kv)
		}
	}
	return env
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitHTTP polls url until it answers want or a generous deadline passes.
func waitHTTP(t *testing.T, url string, want int, exited *exit) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		res, err := http.Get(url)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == want {
				return
			}
		}
		select {
		case <-exited.done:
			t.Fatalf("deepseed exited while waiting for %s: %v", url, exited.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s to answer %d", url, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitMode polls base/readyz until it names the database mode, and
// returns it.
func waitMode(t *testing.T, base string, exited *exit) string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		res, err := http.Get(base + "/readyz")
		if err == nil {
			var r struct {
				Mode string `json:"mode"`
			}
			_ = json.NewDecoder(res.Body).Decode(&r)
			res.Body.Close()
			if r.Mode != "" {
				return r.Mode
			}
		}
		select {
		case <-exited.done:
			t.Fatalf("deepseed exited while waiting for its database mode: %v", exited.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("gave up waiting for /readyz to name the database mode")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// exit is the end of a child process: done is closed once err is set.
type exit struct {
	done chan struct{}
	err  error
}

func itoa(n int) string { return strconv.Itoa(n) }
