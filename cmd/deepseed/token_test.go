package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/server/servertest"
	"github.com/deepseed/deepseed/store/storetest"
)

// An agent with no token is refused before it sets anything up: no state
// directory, and a line naming DEEPSEED_AGENT_TOKEN. One whose token the
// server refuses names the same variable.
func TestAgentTokenNamed(t *testing.T) {
	state := filepath.Join(t.TempDir(), "agent-state")
	code, _, stderr := runBinary(t, nil, "agent", "--fake-gpus", "1", "--state-dir", state, "--server", "http://127.0.0.1:9")
	oneLine(t, "agent without a token", code, stderr, nil, "no agent token", "DEEPSEED_AGENT_TOKEN", "--token-file", "DEEPSEED_AGENT_TOKENS")
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("agent without a token created its state directory %s (%v)", state, err)
	}

	st := storetest.Open(t, storetest.NewDatabase(t), nil)
	cfg := server.DefaultConfig()
	cfg.AgentTokens = []string{"node1:node1-token"}
	base := servertest.Start(t, cfg, st)
	code, _, stderr = runBinary(t, []string{"DEEPSEED_AGENT_TOKEN=wrong-agent-token"}, "agent", "--name", "node1", "--fake-gpus", "1",
		"--state-dir", state, "--server", base, "--allow-root-jobs")
	last := lastLine(stderr)
	if code == 0 || !strings.Contains(last, "DEEPSEED_AGENT_TOKEN ") || strings.Contains(stderr, "wrong-agent-token") {
		t.Errorf("agent with a refused token: exit %d, stderr:\n%s", code, stderr)
	}
}

// A collector whose token the server refuses says so once, at error
// level, naming the variable and that it will not get better by itself.
func TestCollectRefusedTokenSaysWhatToDo(t *testing.T) {
	st := storetest.Open(t, storetest.NewDatabase(t), nil)
	cfg := server.DefaultConfig()
	cfg.IngestTokens = []string{"another-token"} // startCollect sends collect-token
	base := servertest.Start(t, cfg, st)
	p := startCollect(t, base, t.TempDir(), freePort(t))
	if code, _, err := p.post("refused-token-run", 0, 0, 3); err != nil || code != 200 {
		t.Fatalf("hook post: %d %v", code, err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	const want = "the server refuses this collector's token"
	for !strings.Contains(p.logs.String(), want) {
		select {
		case <-p.done:
			t.Fatalf("collect exited:\n%s", p.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("collect never said %q:\n%s", want, p.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.kill()
	logs := p.logs.String()
	for _, w := range []string{"level=ERROR", "DEEPSEED_TOKEN", "--token-file", "DEEPSEED_INGEST_TOKENS", "until the collector is restarted"} {
		if !strings.Contains(logs, w) {
			t.Errorf("collect's refusal lacks %q:\n%s", w, logs)
		}
	}
	if strings.Contains(logs, "collect-token") {
		t.Errorf("collect's log shows its token:\n%s", logs)
	}
}

// collect --no-gpu says GPU sampling is off because it was asked, not
// that an NVML library is missing.
func TestCollectNoGPUSaysWhy(t *testing.T) {
	p := startCollect(t, "", t.TempDir(), freePort(t))
	p.kill()
	logs := p.logs.String()
	if strings.Contains(logs, "no NVML library") || !strings.Contains(logs, `GPU sampling is off" reason="not asked for (--no-gpu)"`) {
		t.Errorf("collect --no-gpu:\n%s", logs)
	}
}
