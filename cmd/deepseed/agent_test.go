package main

import (
	"os"
	"strings"
	"testing"
)

// deepseed agent run by root refuses to run jobs as root without
// --run-as or --allow-root-jobs, naming both; a token on its command line
// is refused.
func TestAgentRefusesRootJobsAndTokenFlag(t *testing.T) {
	dir := t.TempDir()
	code, _, stderr := runBinary(t, []string{"DEEPSEED_AGENT_TOKEN=node1-token"}, "agent", "--fake-gpus", "1", "--state-dir", dir, "--server", "http://127.0.0.1:9")
	if os.Geteuid() == 0 {
		if code == 0 || !strings.Contains(stderr, "refusing to run jobs as root") || !strings.Contains(stderr, "--run-as") || !strings.Contains(stderr, "--allow-root-jobs") {
			t.Errorf("root agent without --run-as: exit %d\n%s", code, stderr)
		}
	}
	code, _, stderr = runBinary(t, nil, "agent", "--token", "s3cret", "--fake-gpus", "1", "--state-dir", dir)
	if strings.Contains(stderr, "s3cret") {
		t.Errorf("agent --token echoes the token: %s", stderr)
	}
	if code == 0 || !strings.Contains(stderr, "DEEPSEED_AGENT_TOKEN") || !strings.Contains(stderr, "--token-file") {
		t.Errorf("agent --token: exit %d\n%s", code, stderr)
	}
}
