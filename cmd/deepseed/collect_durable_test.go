package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/server/servertest"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// collectProc is a real "deepseed collect" process.
type collectProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	logs *syncBuffer // read while the child writes it
	hook string      // the hook receiver's ingest URL
}

func startCollect(t *testing.T, serverURL, spoolDir string, hookPort int, extra ...string) *collectProc {
	t.Helper()
	args := append([]string{"collect", "--server", serverURL, "--hook-listen", fmt.Sprintf("127.0.0.1:%d", hookPort),
		"--metrics-listen", "", "--no-gpu", "--spool-dir", spoolDir, "--batch-max-age", "50ms", "--interval", "1h",
		"--host-name", "durable-node"}, extra...)
	cmd := exec.Command(binary(t), args...)
	cmd.Env = append(cleanEnv(), "DEEPSEED_TOKEN=collect-token")
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &collectProc{cmd: cmd, done: make(chan struct{}), logs: logs, hook: fmt.Sprintf("http://127.0.0.1:%d/api/v1/ingest", hookPort)}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("deepseed collect output:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(p.hook)
		if err == nil {
			resp.Body.Close()
			return p // any answer: the receiver is up
		}
		select {
		case <-p.done:
			t.Fatalf("deepseed collect exited at start:\n%s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hook receiver never came up:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill ends the collector with SIGKILL: no flush, no shutdown.
func (p *collectProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// post sends the steps [from, to) of rank as one hook request and returns
// the status and the Retry-After header.
func (p *collectProc) post(run string, rank, from, to int) (int, string, error) {
	var b strings.Builder
	for s := from; s < to; s++ {
		fmt.Fprintf(&b, `{"kind":"step","run_id":%q,"rank":%d,"step":%d,"time":%d,"loss":1.5}`+"\n", run, rank, s, 1700000000+s)
	}
	resp, err := http.Post(p.hook, "application/x-ndjson", strings.NewReader(b.String()))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), nil
}

func durableServer(t *testing.T) (string, *store.Store) {
	t.Helper()
	dbURL := storetest.NewDatabase(t)
	st, err := store.Open(context.Background(), dbURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	cfg := server.DefaultConfig()
	cfg.IngestTokens = []string{"collect-token"}
	return servertest.Start(t, cfg, st), st
}

// stepsOf returns the stored steps of run as a set, and how many keys are
// stored more than once.
func stepsOf(t *testing.T, st *store.Store, run string) (map[int]bool, int) {
	t.Helper()
	copies, err := st.StepCopies(context.Background(), run)
	if err != nil {
		t.Fatal(err)
	}
	got, twice := map[int]bool{}, 0
	for step, n := range copies {
		got[int(step)] = true
		if n > 1 {
			twice++
		}
	}
	return got, twice
}

func waitSteps(t *testing.T, st *store.Store, run string, want int) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		got, _ := stepsOf(t, st, run)
		if len(got) >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d acknowledged steps of %s arrived", len(got), want, run)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitSpoolEmpty waits until a collector's spool directory holds no batch
// file: every record it kept has been sent and taken by the server.
func waitSpoolEmpty(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		left := 0
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".ndjson") {
				left++
			}
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the collector's spool still holds %d batches", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Records the collector acknowledged survive kill -9 of the collector,
// whether the server was away (they wait in the spool) or up (they are
// being sent), and arrive once each.
func TestCollectKill9KeepsAcknowledged(t *testing.T) {
	base, st := durableServer(t)
	spool := t.TempDir()
	port := freePort(t)

	// The server is away: acknowledged records exist only in the spool.
	down := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	c := startCollect(t, down, spool, port)
	for s := 0; s < 500; s += 50 {
		if code, _, err := c.post("away", 0, s, s+50); err != nil || code != 200 {
			t.Fatalf("post: %d %v", code, err)
		}
	}
	c.kill()

	// Back up, with the server reachable: the spool is sent; meanwhile
	// senders post and the collector is killed again mid-stream.
	c = startCollect(t, base, spool, port)
	var mu sync.Mutex
	acked := map[int]bool{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for s := 0; ; s += 10 {
			select {
			case <-stop:
				return
			default:
			}
			code, _, err := c.post("live", 0, s, s+10)
			if err == nil && code == 200 {
				mu.Lock()
				for i := s; i < s+10; i++ {
					acked[i] = true
				}
				mu.Unlock()
			}
			if err != nil {
				return // the collector is gone
			}
		}
	}()
	// Killed mid-stream: once live posts are being acknowledged, however
	// slowly the restarted collector came up.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no live post was acknowledged in 2 minutes")
		}
	}
	c.kill()
	close(stop)
	wg.Wait()
	c = startCollect(t, base, spool, port)

	waitSteps(t, st, "away", 500)
	mu.Lock()
	defer mu.Unlock()
	if len(acked) == 0 {
		t.Fatal("no live post was acknowledged before the kill")
	}
	waitSteps(t, st, "live", len(acked))
	for _, run := range []string{"away", "live"} {
		got, twice := stepsOf(t, st, run)
		if twice != 0 {
			t.Errorf("%s: %d steps stored twice", run, twice)
		}
		if run == "away" && len(got) != 500 {
			t.Errorf("away: %d of 500 acknowledged steps stored", len(got))
		}
		if run == "live" {
			for s := range acked {
				if !got[s] {
					t.Errorf("live: acknowledged step %d lost", s)
				}
			}
		}
	}
}

// A collector whose spool is full while the server is away answers the
// hook 503 with Retry-After, acknowledging nothing it cannot keep; once the
// server is back exactly the acknowledged records arrive.
func TestCollectSpoolFullDefers(t *testing.T) {
	base, st := durableServer(t)
	spool := t.TempDir()
	port := freePort(t)
	down := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	c := startCollect(t, down, spool, port, "--spool-max-bytes", "8192")
	acked, deferred := 0, 0
	for s := 0; s < 2000 && deferred < 3; s += 20 {
		code, retry, err := c.post("full", 0, s, s+20)
		if err != nil {
			t.Fatal(err)
		}
		switch code {
		case 200:
			if deferred > 0 {
				t.Fatalf("a post after a 503 was acknowledged while the server is still away")
			}
			acked += 20
		case 503:
			if retry == "" {
				t.Fatal("503 without Retry-After")
			}
			deferred++
		default:
			t.Fatalf("status %d", code)
		}
	}
	if deferred == 0 || acked == 0 {
		t.Fatalf("%d acknowledged, %d deferred: want both", acked, deferred)
	}
	c.kill()
	c = startCollect(t, base, spool, port, "--spool-max-bytes", "8192")
	waitSteps(t, st, "full", acked)
	// Counted once the collector holds nothing more to send, rather than
	// after a pause that a loaded machine may not give it.
	waitSpoolEmpty(t, spool)
	got, twice := stepsOf(t, st, "full")
	if len(got) != acked || twice != 0 {
		t.Fatalf("%d steps stored (%d twice), want exactly the %d acknowledged", len(got), twice, acked)
	}
}
