package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store/storetest"
)

const withoutDockerPage = "../../docs/without-docker.md"

// pageBlock is one fenced sh block of a page, under its section.
type pageBlock struct{ section, text string }

// shellBlocks returns the page's ```sh blocks, in order, each with the
// "## " heading above it (indented ones, inside list items, included).
func shellBlocks(t *testing.T, page string) []pageBlock {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	var out []pageBlock
	section := "Build"
	var cur []string
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(l)
		switch {
		case !in && strings.HasPrefix(l, "## "):
			section = strings.TrimPrefix(l, "## ")
		case !in && trimmed == "```sh":
			in, cur = true, nil
		case in && trimmed == "```":
			in = false
			out = append(out, pageBlock{section, strings.Join(cur, "\n")})
		case in:
			cur = append(cur, trimmed)
		}
	}
	return out
}

// commandLines joins a block's continued lines and drops comments.
func commandLines(block string) []string {
	var out []string
	var cur string
	for _, l := range strings.Split(block, "\n") {
		if strings.HasSuffix(l, `\`) {
			cur += strings.TrimSuffix(l, `\`) + " "
			continue
		}
		cur += l
		if c := strings.TrimSpace(cur); c != "" && !strings.HasPrefix(c, "#") {
			out = append(out, c)
		}
		cur = ""
	}
	return out
}

// docShell runs a page's commands one after another in dir, in bash,
// keeping what each exports for the next (the page's commands share one
// shell), with a clean DEEPSEED_ environment plus env.
type docShell struct {
	t     *testing.T
	dir   string
	state string
	env   []string
}

func (s *docShell) script(cmd string) string {
	return "set -e -o pipefail\nsource " + s.state + "\n" + cmd
}

// run runs cmd to its end and returns its output; a failure fails the
// test, naming the command as the page writes it.
func (s *docShell) run(cmd, asWritten string) string {
	s.t.Helper()
	c := exec.Command("bash", "-c", s.script(cmd+"\nexport -p > "+s.state))
	c.Dir, c.Env = s.dir, s.env
	out, err := c.CombinedOutput()
	if err != nil {
		s.t.Fatalf("the page's %q: %v\n%s", asWritten, err, out)
	}
	return string(out)
}

// start starts cmd, which runs until stopped, and stops it at the end
// of the test; exited is closed if it ends before.
func (s *docShell) start(cmd string) (logs *syncBuffer, exited *exit) {
	s.t.Helper()
	c := exec.Command("bash", "-c", s.script("exec "+cmd))
	c.Dir, c.Env = s.dir, s.env
	logs = &syncBuffer{}
	c.Stdout, c.Stderr = logs, logs
	if err := c.Start(); err != nil {
		s.t.Fatal(err)
	}
	exited = &exit{done: make(chan struct{})}
	go func() {
		exited.err = c.Wait()
		close(exited.done)
	}()
	s.t.Cleanup(func() {
		_ = c.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited.done:
		case <-time.After(90 * time.Second):
			_ = c.Process.Kill()
		}
		if s.t.Failed() {
			s.t.Logf("%s:\n%s", cmd, logs.String())
		}
	})
	return logs, exited
}

// docs/without-docker.md, followed as written: its shell blocks run one
// after another in a temporary directory, with ./deepseed built from this
// tree, against the private PostgreSQL the page describes (its external
// database URL is the one line not run). Ports and the root-only spool
// directory are replaced by free ones, and each replacement is logged.
// Each step's visible result is checked: the server answers, the demo's
// runs are stored, the collector forwards a torch-free hook run. Grafana
// is checked by its provisioning files (TestWithoutDockerGrafanaFiles).
func TestWithoutDockerPageRunsAsWritten(t *testing.T) {
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the page's steps need %s, which this machine lacks", tool)
		}
	}
	dir := t.TempDir()
	if err := os.Link(binary(t), filepath.Join(dir, "deepseed")); err != nil {
		b, err := os.ReadFile(binary(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "deepseed"), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	port, metricsPort, hookPort := freePort(t), freePort(t), freePort(t)
	spool := filepath.Join(dir, "spool")
	state := filepath.Join(dir, "shell-state")
	if err := os.WriteFile(state, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sh := &docShell{t: t, dir: dir, state: state, env: append(cleanEnv(),
		"DEEPSEED_DATA_DIR="+storetest.DataDir(t), "DEEPSEED_LOCAL_PG_PORT="+itoa(freePort(t)))}
	replacements := []struct{ old, new string }{
		{":8080", fmt.Sprintf(":%d", port)},
		{"deepseed-server", "127.0.0.1"},
		{"0.0.0.0:9400", fmt.Sprintf("127.0.0.1:%d", metricsPort)},
		{"127.0.0.1:9464", fmt.Sprintf("127.0.0.1:%d", hookPort)},
		{"/var/lib/deepseed/spool", spool},
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)

	ran := map[string]bool{}
	readToken := ""
	for _, b := range shellBlocks(t, withoutDockerPage) {
		for _, line := range commandLines(b.text) {
			cmd := line
			for _, r := range replacements {
				if strings.Contains(cmd, r.old) {
					cmd = strings.ReplaceAll(cmd, r.old, r.new)
				}
			}
			if cmd != line {
				t.Logf("%s: %q runs as %q", b.section, line, cmd)
			}
			switch {
			case strings.HasPrefix(b.section, "4.") || strings.HasPrefix(b.section, "Changing the dashboards"):
				// Grafana's files (TestWithoutDockerGrafanaFiles) and the
				// generator, which rewrites committed files.
				t.Logf("%s: not run here: %q", b.section, line)
			case strings.HasPrefix(cmd, "go build -o deepseed ./cmd/deepseed"):
				t.Logf("%s: ./deepseed is this test's build of the tree (%q)", b.section, line)
			case strings.HasPrefix(cmd, "cd grafana-plugin && npm"):
				t.Logf("%s: skipped, the plugin's npm build is grafana-plugin/test.sh's: %q", b.section, line)
			case strings.HasPrefix(cmd, "export DEEPSEED_DATABASE_URL="):
				t.Logf("%s: skipped %q: the test takes the page's private-PostgreSQL path (no DEEPSEED_DATABASE_URL)", b.section, line)
			case strings.HasPrefix(cmd, "./deepseed serve"):
				_, exited := sh.start(cmd)
				// The page checks it right away; a new private cluster
				// takes a moment to initialise.
				waitHTTP(t, base+"/readyz", 200, exited)
				ran["serve"] = true
			case strings.HasPrefix(cmd, "curl "):
				if out := sh.run(cmd, line); !strings.Contains(out, `"ready":true`) {
					t.Errorf("%q answered %q", line, out)
				}
				ran["curl"] = true
			case strings.Contains(cmd, "./deepseed demo"):
				sh.run(cmd, line)
				readToken = sh.run(`printf %s "$DEEPSEED_READ_TOKEN"`, "the page's DEEPSEED_READ_TOKEN")
				if runs := listRuns(t, base, readToken); runs.Total == 0 {
					t.Errorf("after %q the server lists no run", line)
				}
				ran["demo"] = true
			case strings.HasPrefix(cmd, "./deepseed collect"):
				_, exited := sh.start(cmd)
				waitTCP(t, fmt.Sprintf("127.0.0.1:%d", hookPort), exited)
				hookRunThroughCollector(t, base, readToken, hookPort)
				ran["collect"] = true
			default:
				sh.run(cmd, line)
			}
		}
	}
	for _, step := range []string{"serve", "curl", "demo", "collect"} {
		if !ran[step] {
			t.Errorf("the page has no %s step that this test recognised: it changed under the test", step)
		}
	}
	t.Log("the page has no agent step; the agent running jobs as written in docs/jobs.md is TestJobCommandsSayWhatHappens'")
}

func listRuns(t *testing.T, base, token string) api.RunList {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/api/v1/runs?limit=500", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var l api.RunList
	if res.StatusCode != 200 || json.NewDecoder(res.Body).Decode(&l) != nil {
		t.Fatalf("GET /api/v1/runs: %d", res.StatusCode)
	}
	return l
}

// waitTCP waits until addr accepts a connection.
func waitTCP(t *testing.T, addr string, exited *exit) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
		select {
		case <-exited.done:
			t.Fatalf("exited while waiting for %s: %v", addr, exited.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", addr)
		}
	}
}

// hookRunThroughCollector runs a torch-free training script with the
// hook of this tree against the collector, as a script on the node would,
// and waits for its steps on the server.
func hookRunThroughCollector(t *testing.T, base, readToken string, hookPort int) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Log("skipped the hook run through the collector: no python3 on this machine")
		return
	}
	hook, err := filepath.Abs("../../hook")
	if err != nil {
		t.Fatal(err)
	}
	script := `import sys; sys.path.insert(0, sys.argv[1])
import deepseed
run = deepseed.init(project="without-docker", name="hook-run", run_id="without-docker-hook")
for i in range(1, 21):
    run.log_step(i, loss=1.0 / i, samples=8)
run.finish()
`
	c := exec.Command(py, "-c", script, hook)
	c.Dir = t.TempDir()
	c.Env = append(cleanEnv(), fmt.Sprintf("DEEPSEED_COLLECTOR_URL=http://127.0.0.1:%d", hookPort))
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("the hook run: %v\n%s", err, out)
	}
	var got api.RunDetail
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		req, _ := http.NewRequest("GET", base+"/api/v1/runs/without-docker-hook", nil)
		req.Header.Set("Authorization", "Bearer "+readToken)
		if res, err := http.DefaultClient.Do(req); err == nil {
			if res.StatusCode == 200 {
				_ = json.NewDecoder(res.Body).Decode(&got)
			}
			res.Body.Close()
		}
		if got.Steps == 20 && got.Status == "finished" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hook's run through the collector: %d steps, status %q on the server, want 20, finished", got.Steps, got.Status)
		}
	}
}

// The Grafana part of docs/without-docker.md, checked by its files: every
// file it copies exists, the provider reads the directory the page copies
// the dashboards to, the data source keeps the uid the page names, the
// Grafana version it asks for is the plugin's and the compose file's, and
// the backends it lists are the ones the build makes.
func TestWithoutDockerGrafanaFiles(t *testing.T) {
	page, err := os.ReadFile(withoutDockerPage)
	if err != nil {
		t.Fatal(err)
	}
	text := string(page)
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join("../..", p))
		if err != nil {
			t.Fatalf("the page copies %s: %v", p, err)
		}
		return string(b)
	}
	copies := 0
	for _, b := range shellBlocks(t, withoutDockerPage) {
		for _, line := range commandLines(b.text) {
			f := strings.Fields(line)
			if len(f) < 4 || f[0] != "sudo" || f[1] != "cp" {
				continue
			}
			src := f[len(f)-2]
			if strings.HasPrefix(src, "grafana-plugin/dist/") {
				// The plugin's build output, checked below against the build.
				copies++
				continue
			}
			matches, _ := filepath.Glob(filepath.Join("../..", strings.TrimSuffix(src, "/.")))
			if len(matches) == 0 {
				t.Errorf("%q: no %s in the repository", line, src)
			}
			copies++
		}
	}
	if copies < 4 {
		t.Errorf("found %d sudo cp steps in the page, want the plugin, the dashboards, their provider and the alert rules", copies)
	}
	for _, want := range []string{"grafana/provisioning/alerting/deepseed.yaml", "dashboards/provisioning/datasources/deepseed.yaml",
		"dashboards/provisioning/dashboards/deepseed.yaml"} {
		read(want)
		if !strings.Contains(text, want) {
			t.Errorf("the page never installs %s", want)
		}
	}
	if p := regexp.MustCompile(`(?m)^\s*path: (\S+)`).FindStringSubmatch(read("dashboards/provisioning/dashboards/deepseed.yaml")); p == nil ||
		!strings.Contains(text, "sudo cp dashboards/json/*.json "+p[1]+"/") {
		t.Errorf("the dashboards provider reads %v; the page copies the JSON elsewhere", p)
	}
	if !strings.Contains(read("dashboards/provisioning/datasources/deepseed.yaml"), "uid: deepseed") || !strings.Contains(text, "uid, `deepseed`") {
		t.Error("the data source's uid and the page's disagree")
	}
	dep := regexp.MustCompile(`"grafanaDependency": ">=(\d+\.\d+)`).FindStringSubmatch(read("grafana-plugin/src/plugin.json"))
	img := regexp.MustCompile(`GRAFANA_VERSION=(\d+\.\d+)`).FindStringSubmatch(read("grafana/Dockerfile"))
	asked := regexp.MustCompile(`Grafana (\d+\.\d+) or newer`).FindAllStringSubmatch(text, -1)
	if dep == nil || img == nil || len(asked) == 0 {
		t.Fatalf("plugin.json %v, grafana/Dockerfile %v, page %v: a Grafana version not found", dep, img, asked)
	}
	for _, a := range asked {
		if a[1] != dep[1] || a[1] != img[1] {
			t.Errorf("the page asks for Grafana %s; plugin.json needs %s, the compose file runs %s", a[1], dep[1], img[1])
		}
	}
	for _, arch := range regexp.MustCompile(`for arch in ([a-z0-9 ]+); do`).FindStringSubmatch(read("grafana-plugin/build-backend.sh"))[1:] {
		for _, a := range strings.Fields(arch) {
			if !strings.Contains(text, "gpx_deepseed_linux_"+a) {
				t.Errorf("the build makes gpx_deepseed_linux_%s; the page does not say so", a)
			}
		}
	}
}
