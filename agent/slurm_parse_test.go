package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSlurmBatchScript runs the batch script with the machine's sh, as
// slurmd would, and checks that argv and env arrive byte for byte and the
// exit status is kept.
func TestSlurmBatchScript(t *testing.T) {
	dir := t.TempDir()
	items := []string{"two words", `"dq"`, "'sq'", "it's", "$HOME", "${PATH}", "a;b", "a&&b", "`id`", "$(id)", "*", "?", "~", "", "line\nbreak", `back\slash`, "tab\there", "ünï", "-n"}
	spec := Spec{
		JobID: "job-1\nrm -rf /", // a newline in the id must not end the comment line
		Argv:  append([]string{"/bin/sh", "-c", `printf '%s\0' "$@"; printf '%s\0' "$WEIRD"; exit 7`, "sh"}, items...),
		Env:   []string{"WEIRD=a,b c'd \"e\" $HOME ;f\ng"},
	}
	exitFile := filepath.Join(dir, "job.exit")
	script, err := batchScript(spec, exitFile)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "job.sh")
	if err := os.WriteFile(path, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", path)
	cmd.Dir = dir
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 {
		t.Fatalf("script exit: %v, want exit status 7\n%s", err, script)
	}
	got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	want := append(append([]string{}, items...), "a,b c'd \"e\" $HOME ;f\ng")
	if strings.Join(got, "|") != strings.Join(want, "|") || len(got) != len(want) {
		t.Errorf("arrived as\n%q\nwant\n%q\nscript:\n%s", got, want, script)
	}
	if b, err := os.ReadFile(exitFile); err != nil || strings.TrimSpace(string(b)) != "7" {
		t.Errorf("exit file: %q, %v; want 7", b, err)
	}
}

func TestSlurmBatchScriptRefuses(t *testing.T) {
	for _, spec := range []Spec{
		{Argv: []string{"true"}, Env: []string{"NOEQUALS"}},
		{Argv: []string{"true"}, Env: []string{"1X=1"}},
		{Argv: []string{"true"}, Env: []string{"A B=1"}},
		{Argv: []string{"true"}, Env: []string{"X=a\x00b"}},
		{Argv: []string{"true", "a\x00b"}},
	} {
		if _, err := batchScript(spec, "/tmp/x.exit"); err == nil {
			t.Errorf("batchScript(%q, %q): want an error", spec.Argv, spec.Env)
		}
	}
}

func TestMapSlurmState(t *testing.T) {
	for _, c := range []struct {
		slurm, reason, state, detail string
	}{
		{"PENDING", "None", StateQueued, ""},
		{"PENDING", "Resources", StateQueued, "slurm: PENDING (Resources)"},
		{"CONFIGURING", "", StateQueued, "slurm: CONFIGURING"},
		{"RUNNING", "None", StateRunning, ""},
		{"COMPLETING", "", StateRunning, ""},
		{"SUSPENDED", "", StateRunning, "slurm: SUSPENDED"},
		{"COMPLETED", "", StateFinished, ""},
		{"FAILED", "NonZeroExitCode", StateFailed, "slurm: FAILED (NonZeroExitCode)"},
		{"OUT_OF_MEMORY", "", StateFailed, "slurm: OUT_OF_MEMORY"},
		{"TIMEOUT", "", StateFailed, "slurm: TIMEOUT"},
		{"NODE_FAIL", "", StateFailed, "slurm: NODE_FAIL"},
		{"CANCELLED", "", StateCancelled, "slurm: CANCELLED"},
		{"SOMETHING_NEW", "", StateRunning, "slurm: SOMETHING_NEW"},
	} {
		st, d := mapSlurmState(c.slurm, c.reason)
		if st != c.state || d != c.detail {
			t.Errorf("mapSlurmState(%s, %s) = %s, %q; want %s, %q", c.slurm, c.reason, st, d, c.state, c.detail)
		}
	}
}

func TestParseSqueueAndSacct(t *testing.T) {
	// As squeue 22.05 prints --Format=JobID:|,State:|,exit_code:|,Reason:256|.
	q, err := parseSqueue("12|FAILED|768|NonZeroExitCode                                     |\n", "12")
	if err != nil || !q.found || q.state != "FAILED" || q.exit != 3 || q.signal != 0 || q.reason != "NonZeroExitCode" {
		t.Errorf("squeue failed: %+v, %v", q, err)
	}
	q, _ = parseSqueue("13|CANCELLED|15|None|\n", "13")
	if q.exit != 0 || q.signal != 15 {
		t.Errorf("squeue signalled: %+v", q)
	}
	if q, _ := parseSqueue("", "13"); q.found {
		t.Errorf("empty squeue output found a job: %+v", q)
	}
	if _, err := parseSqueue("14|FAILED|x|None|", "14"); err == nil {
		t.Error("squeue: bad exit code accepted")
	}
	// As sacct prints --noheader --parsable2 --format=JobID,State,ExitCode.
	a, err := parseSacct("20|CANCELLED by 0|0:15\n", "20")
	if err != nil || !a.found || a.state != "CANCELLED" || a.signal != 15 {
		t.Errorf("sacct cancelled: %+v, %v", a, err)
	}
	a, _ = parseSacct("21|OUT_OF_MEMORY|0:125\n", "21")
	if a.state != "OUT_OF_MEMORY" {
		t.Errorf("sacct oom: %+v", a)
	}
	if a, _ := parseSacct("22|COMPLETED|0:0\n", "23"); a.found {
		t.Errorf("sacct: another job's line taken: %+v", a)
	}
	if _, err := parseSacct("24|FAILED|3\n", "24"); err == nil {
		t.Error("sacct: exit code without signal accepted")
	}
}

func TestParseParsable(t *testing.T) {
	for in, want := range map[string]string{"42\n": "42", "43;cluster2\n": "43", "sbatch: warning: x\n44\n": "44"} {
		if got, err := parseParsable([]byte(in)); err != nil || got != want {
			t.Errorf("parseParsable(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := parseParsable([]byte("Submitted batch job 45\n")); err == nil {
		t.Error("parseParsable accepted a non-parsable answer")
	}
}
