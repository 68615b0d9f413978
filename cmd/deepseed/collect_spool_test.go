package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A normal user runs the collector with no --spool-dir: the spool goes
// under the user's state directory, which it may write, and the collector
// says where at start. Run as root, the test runs the collector as the
// unprivileged user nobody.
func TestCollectDefaultSpoolIsTheUsersStateDir(t *testing.T) {
	dir := t.TempDir()
	// Let another user reach the binary and the home directory: open the
	// test's own directories (below the temporary root, never the root).
	root := filepath.Clean(os.TempDir())
	for d := dir; filepath.Dir(d) != d && strings.HasPrefix(d, root+string(filepath.Separator)); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "deepseed")
	copyFile(t, binary(t), bin)
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "collect", "--no-gpu", "--metrics-listen", "", "--interval", "1h",
		"--hook-listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	env := []string{"HOME=" + home}
	for _, kv := range cleanEnv() {
		if !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "XDG_STATE_HOME=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	if os.Geteuid() == 0 {
		const nobody = 65534
		if err := os.Chown(home, nobody, nobody); err != nil {
			t.Fatal(err)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	}
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	want := filepath.Join(home, ".local", "state", "deepseed", "spool")
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(logs.String(), "hook receiver listening") {
		select {
		case err := <-done:
			t.Fatalf("collect exited at start (%v):\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("collect did not start:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	<-done
	if !strings.Contains(logs.String(), "spool directory") || !strings.Contains(logs.String(), "dir="+want) {
		t.Errorf("collect did not say it spools to %s:\n%s", want, logs.String())
	}
	if fi, err := os.Stat(want); err != nil || !fi.IsDir() {
		t.Errorf("spool directory %s: %v", want, err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a bytes.Buffer safe for a child's output and a reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
