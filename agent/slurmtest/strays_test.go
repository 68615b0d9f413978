package slurmtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestStrays checks that the leak sweep finds a process by the cluster's
// SLURM_CONF in its environment, and only such a process.
func TestStrays(t *testing.T) {
	c := &Cluster{Conf: filepath.Join(t.TempDir(), "slurm.conf")}
	start := func(conf string) *exec.Cmd {
		cmd := exec.Command("sleep", "30")
		cmd.Env = append(os.Environ(), "SLURM_CONF="+conf)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	mine, other := start(c.Conf), start(c.Conf+".other")
	// A process just started may not show its environment in /proc yet
	// on a loaded machine: wait for the sweep to see it, generously.
	got := c.strays()
	for deadline := time.Now().Add(time.Minute); !slices.Contains(got, mine.Process.Pid) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		got = c.strays()
	}
	if !slices.Contains(got, mine.Process.Pid) || slices.Contains(got, other.Process.Pid) {
		t.Fatalf("strays %v: want %d and not %d", got, mine.Process.Pid, other.Process.Pid)
	}
}
