package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/server/servertest"
	"github.com/deepseed/deepseed/store/storetest"
)

// oneLine checks that a failed command ended with one line on standard
// error that starts "deepseed: ", holds every want, and shows no stack
// trace, no Go type and none of the secrets.
func oneLine(t *testing.T, what string, code int, stderr string, secrets []string, want ...string) {
	t.Helper()
	line := strings.TrimSpace(stderr)
	if code == 0 {
		t.Errorf("%s: exit 0, want a failure", what)
	}
	if strings.Contains(line, "\n") || !strings.HasPrefix(line, "deepseed: ") {
		t.Errorf("%s: want one line starting \"deepseed: \", got:\n%s", what, stderr)
	}
	for _, bad := range []string{"goroutine ", "runtime.", "Go value", "Go struct", "struct {", "panic:"} {
		if strings.Contains(stderr, bad) {
			t.Errorf("%s: stderr shows %q:\n%s", what, bad, stderr)
		}
	}
	for _, s := range secrets {
		if strings.Contains(stderr, s) {
			t.Errorf("%s: stderr echoes the secret %q:\n%s", what, s, stderr)
		}
	}
	for _, w := range want {
		if !strings.Contains(line, w) {
			t.Errorf("%s: stderr lacks %q:\n%s", what, w, stderr)
		}
	}
}

// A token on the command line is refused by every command that sends
// one, in one line that names the variable and --token-file and never
// the token itself, however it is written.
func TestTokenFlagRefusedWithoutEcho(t *testing.T) {
	const secret = "s3cret-on-the-command-line"
	cases := []struct {
		args []string
		env  string
	}{
		{[]string{"agent", "--token", secret, "--fake-gpus", "1"}, "DEEPSEED_AGENT_TOKEN"},
		{[]string{"agent", "-token=" + secret}, "DEEPSEED_AGENT_TOKEN"},
		{[]string{"collect", "--token", secret, "--no-gpu"}, "DEEPSEED_TOKEN"},
		{[]string{"collect", "--token=" + secret}, "DEEPSEED_TOKEN"},
		{[]string{"job", "list", "--token", secret}, "DEEPSEED_TOKEN"},
		{[]string{"job", "show", "7", "--token", secret}, "DEEPSEED_TOKEN"},
		{[]string{"job", "cancel", "7", "--token", secret}, "DEEPSEED_TOKEN"},
		{[]string{"job", "submit", "--token", secret, "--project", "p", "--", "true"}, "DEEPSEED_TOKEN"},
		{[]string{"sweep", "show", "s", "--token", secret}, "DEEPSEED_TOKEN"},
		{[]string{"quota", "show", "--token", secret}, "DEEPSEED_TOKEN"},
		{[]string{"import", "--token", secret, "x.json"}, "DEEPSEED_TOKEN"},
		{[]string{"demo", "--token", secret}, "DEEPSEED_TOKEN"},
		{[]string{"bench", "ingest", "--token", secret}, "DEEPSEED_TOKEN"},
		{[]string{"bench", "query", "--read-token", secret}, "DEEPSEED_READ_TOKEN"},
	}
	for _, c := range cases {
		code, _, stderr := runBinary(t, nil, c.args...)
		oneLine(t, strings.Join(c.args[:len(c.args)-1], " "), code, stderr, []string{secret}, c.env, "-file", "is not taken")
	}
	// After --, --token belongs to the job's command.
	code, _, stderr := runBinary(t, nil, "job", "submit", "--server", "127.0.0.1:1", "--project", "p", "--", "prog", "--token", "x")
	if strings.Contains(stderr, "is not taken") {
		t.Errorf("job submit -- prog --token x: the command's own flag was refused: exit %d, %s", code, stderr)
	}
}

// Help about help is the usage, not a recursion into a stack overflow.
func TestHelpOfHelp(t *testing.T) {
	for _, args := range [][]string{{"help", "-h"}, {"help", "help"}, {"-h", "-h"}, {"--help", "help", "-h"}} {
		code, stdout, stderr := runBinary(t, nil, args...)
		if code != 0 || stderr != "" || !strings.Contains(stdout, "Commands:") {
			t.Errorf("deepseed %v: exit %d, stderr %q; want the usage and exit 0", args, code, stderr)
		}
	}
	code, stdout, _ := runBinary(t, nil, "help", "job", "submit")
	if code != 0 || !strings.Contains(stdout, "Usage: deepseed job submit") {
		t.Errorf("deepseed help job submit: exit %d:\n%s", code, stdout)
	}
	code, _, stderr := runBinary(t, nil, "help", "nosuch")
	oneLine(t, "help nosuch", code, stderr, nil, `unknown command "nosuch"`)
}

// The client commands against a server that wants tokens, and against
// none: flags after the id are parsed, host:port is a URL, a missing or
// refused token is named with the variable to set, and a server that is
// not there is said so in words, with what to check.
func TestClientCommandLines(t *testing.T) {
	st := storetest.Open(t, storetest.NewDatabase(t), nil)
	cfg := server.DefaultConfig()
	cfg.IngestTokens = []string{"ingest-tok"}
	cfg.SubmitTokens = []string{"submit-tok"}
	base := servertest.Start(t, cfg, st)
	hostPort := strings.TrimPrefix(base, "http://")
	read := []string{"DEEPSEED_TOKEN=ingest-tok"}

	code, _, stderr := runBinary(t, read, "job", "show", "999", "--server", base)
	oneLine(t, "job show 999 --server", code, stderr, nil, "job show: ", "999")
	if strings.Contains(stderr, "give one job id") {
		t.Errorf("job show 999 --server: the flag after the id was not parsed: %s", stderr)
	}
	code, stdout, stderr := runBinary(t, read, "job", "list", "--server", hostPort)
	if code != 0 || !strings.Contains(stdout, "0 jobs") {
		t.Errorf("job list --server host:port: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	// The load tools read --server as every client command does.
	code, _, stderr = runBinary(t, read, "bench", "query", "--server", hostPort, "--ranks", "2", "--steps", "5",
		"--compare-runs", "0", "--rounds", "1", "--warmup", "0", "--prefix", "hostport")
	if code != 0 {
		t.Errorf("bench query --server host:port: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runBinary(t, read, "sweep", "show", "--server", base, "nosuch")
	oneLine(t, "sweep show --server URL ID", code, stderr, nil, "sweep show: ")

	code, _, stderr = runBinary(t, nil, "job", "cancel", "999", "--server", base)
	oneLine(t, "job cancel without a token", code, stderr, nil, "DEEPSEED_TOKEN", "--token-file", "submit token", "DEEPSEED_SUBMIT_TOKENS")
	code, _, stderr = runBinary(t, nil, "quota", "show", "--server", base)
	oneLine(t, "quota show without a token", code, stderr, nil, "DEEPSEED_TOKEN", "--token-file", "read token")
	code, _, stderr = runBinary(t, []string{"DEEPSEED_TOKEN=wrong-tok"}, "job", "list", "--server", base)
	oneLine(t, "job list with a wrong token", code, stderr, []string{"wrong-tok"}, "refused the token from DEEPSEED_TOKEN", "DEEPSEED_READ_TOKENS")
	file := filepath.Join(t.TempDir(), "tok")
	if err := os.WriteFile(file, []byte("wrong-tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runBinary(t, nil, "job", "list", "--server", base, "--token-file", file)
	oneLine(t, "job list with a wrong --token-file", code, stderr, []string{"wrong-tok"}, "refused the token from --token-file "+file)

	dead := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	for _, args := range [][]string{
		{"job", "list", "--server", dead},
		{"quota", "show", "--server", dead},
		{"job", "submit", "--project", "p", "--server", dead, "--", "true"},
	} {
		code, _, stderr = runBinary(t, read, args...)
		oneLine(t, strings.Join(args, " "), code, stderr, nil, "cannot reach the server at http://"+dead, "nothing listens there", "--server or DEEPSEED_SERVER_URL")
	}
	code, _, stderr = runBinary(t, read, "job", "list", "--server", "http://nosuch.invalid:8080")
	oneLine(t, "job list against a host that does not resolve", code, stderr, nil, `"nosuch.invalid" does not resolve`)
	code, _, stderr = runBinary(t, read, "job", "list", "--server", "ftp://x")
	oneLine(t, "job list --server ftp://x", code, stderr, nil, "is not a server URL", "http://host:8080")
}
