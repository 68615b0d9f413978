package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/store/storetest"
)

// Every command's help has one form: asked for, it goes to standard
// output with exit 0; each flag is "--name" on its own line, none in Go's
// bare "-name" form, and the flags read from the environment name their
// variable.
func TestHelpOneStyle(t *testing.T) {
	flagLine := regexp.MustCompile(`^  --[a-z][a-z0-9-]*$`)
	bareFlag := regexp.MustCompile(`^\s+-[a-zA-Z]`)
	helps := [][]string{{"bench", "ingest"}, {"bench", "chaos"}, {"bench", "collector"}}
	for _, c := range commands {
		if c.name != "bench" {
			helps = append(helps, []string{c.name})
		}
	}
	env := map[string][]string{
		"collect": {"DEEPSEED_SERVER_URL", "DEEPSEED_SPOOL_DIR", "DEEPSEED_HOOK_LISTEN", "DEEPSEED_INTERVAL", "DEEPSEED_NO_GPU", "DEEPSEED_DCGM_COMPAT", "DEEPSEED_BATCH_MAX_BYTES"},
		"demo":    {"DEEPSEED_SERVER_URL", "DEEPSEED_TOKEN"},
		"import":  {"DEEPSEED_SERVER_URL", "DEEPSEED_TOKEN", "DEEPSEED_PROJECT"},
	}
	for _, args := range helps {
		name := strings.Join(args, " ")
		code, stdout, stderr := runBinary(t, nil, append(args, "-h")...)
		if code != 0 || stderr != "" {
			t.Errorf("deepseed %s -h: exit %d, stderr %q; want exit 0 and the help on standard output", name, code, stderr)
		}
		flags := 0
		for _, l := range strings.Split(stdout, "\n") {
			if flagLine.MatchString(l) {
				flags++
			}
			if bareFlag.MatchString(l) {
				t.Errorf("deepseed %s -h: flag in another style: %q", name, l)
			}
		}
		if flags == 0 && name != "version" {
			t.Errorf("deepseed %s -h lists no --flag:\n%s", name, stdout)
		}
		for _, v := range env[name] {
			if !strings.Contains(stdout, "(env "+v) {
				t.Errorf("deepseed %s -h does not name %s:\n%s", name, v, stdout)
			}
		}
	}
	// --help and -h are the same.
	_, a, _ := runBinary(t, nil, "collect", "--help")
	_, b, _ := runBinary(t, nil, "collect", "-h")
	if a != b {
		t.Error("deepseed collect --help and -h differ")
	}
}

// "deepseed --version", "deepseed -V" and "deepseed version" agree.
func TestVersionFlagsAgree(t *testing.T) {
	want := "deepseed " + testVersion + "\n"
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}, {"-V"}} {
		code, out, stderr := runBinary(t, nil, args...)
		if code != 0 || out != want || stderr != "" {
			t.Errorf("deepseed %v: exit %d, stdout %q, stderr %q; want %q", args, code, out, stderr, want)
		}
	}
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// Errors end the command with one readable line starting "deepseed:":
// bad flags, an unknown command, the server's refusal in its own words
// (not its JSON with \u003c escapes), and a timeout said as such.
func TestErrorsAreOneReadableLine(t *testing.T) {
	code, _, stderr := runBinary(t, nil, "serve", "--role", "both", "--listen", "nowhere")
	if code != 1 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.HasPrefix(stderr, "deepseed: serve: bad configuration: ") {
		t.Errorf("serve with bad flags: exit %d, stderr %q; want exit 1 and one line", code, stderr)
	}
	code, _, stderr = runBinary(t, nil, "nosuch")
	if code != 1 || !strings.Contains(stderr, `unknown command "nosuch"`) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("unknown command: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runBinary(t, nil, "collect", "--interval", "soon")
	if code != 1 || !strings.Contains(stderr, `invalid --interval "soon"`) {
		t.Errorf("collect --interval soon: exit %d, stderr %q", code, stderr)
	}
	for _, flag := range []string{"--energy-interval", "--gpm-interval", "--process-interval"} {
		code, _, stderr = runBinary(t, nil, "collect", flag, "-5s")
		if code != 1 || !strings.Contains(stderr, `invalid `+flag+` "-5s"`) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("collect %s -5s: exit %d, stderr %q", flag, code, stderr)
		}
	}

	url := storetest.NewDatabase(t)
	port := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	_, exited, _ := startServe(t, []string{"DEEPSEED_DATABASE_URL=" + url, "DEEPSEED_INGEST_TOKENS=right-token"},
		"--listen", fmt.Sprintf("127.0.0.1:%d", port))
	waitHTTP(t, base+"/readyz", 200, exited)
	code, _, stderr = runBinary(t, []string{"DEEPSEED_TOKEN=wrong-token"}, "demo", "--server", base, "--timeout", "1m")
	last := lastLine(stderr)
	if code != 1 || strings.Contains(stderr, `\u003c`) || strings.Contains(stderr, `{"error"`) ||
		!strings.HasPrefix(last, "deepseed: demo: ") || !strings.Contains(last, "refused the token from DEEPSEED_TOKEN (invalid bearer token)") ||
		strings.Contains(stderr, "wrong-token") {
		t.Errorf("demo with a wrong token: exit %d, stderr:\n%s\nwant exit 1 ending in one line with the server's words", code, stderr)
	}
	code, _, stderr = runBinary(t, nil, "demo", "--server", base, "--timeout", "1m")
	if last := lastLine(stderr); code != 1 || !strings.Contains(last, "set DEEPSEED_TOKEN or use --token-file") || !strings.Contains(last, "DEEPSEED_INGEST_TOKENS") {
		t.Errorf("demo without a token: exit %d, last line %q", code, last)
	}

	// Nothing listens on this port: the deadline ends the load, and says so.
	dead := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	code, _, stderr = runBinary(t, nil, "demo", "--server", dead, "--timeout", "2s")
	last = lastLine(stderr)
	if code != 1 || !strings.HasPrefix(last, "deepseed: demo: timed out after 2s waiting for the server at "+dead) ||
		strings.Contains(stderr, "context deadline exceeded") {
		t.Errorf("demo --timeout 2s against nothing: exit %d, stderr:\n%s", code, stderr)
	}
	file := filepath.Join(t.TempDir(), "run.ndjson")
	if err := os.WriteFile(file, []byte(`{"kind":"run","run_id":"cli-timeout","project":"p"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runBinary(t, nil, "import", "--server", dead, "--timeout", "2s", file)
	last = lastLine(stderr)
	if code != 1 || !strings.HasPrefix(last, "deepseed: import: "+file+": timed out after 2s waiting for the server at "+dead) {
		t.Errorf("import --timeout 2s against nothing: exit %d, stderr:\n%s", code, stderr)
	}
}
