package localpg

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// A lock file naming a live process is respected even where the flock is
// free, and one naming a recycled pid (same pid, another start time) is
// taken over. Real processes: this one and a child.
func TestOwnerLockLiveness(t *testing.T) {
	if procStart(os.Getpid()) == "" {
		t.Skip("no /proc: liveness rests on flock alone here")
	}
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	path := filepath.Join(t.TempDir(), "pg.owner")

	live := ownerInfo{PID: child.Process.Pid, Start: procStart(child.Process.Pid), Boot: bootID(), Port: 5499}
	if err := os.WriteFile(path, live.encode(), 0o644); err != nil {
		t.Fatal(err)
	}
	var owned *errOwned
	if l, err := takeOwnerLock(path); !errors.As(err, &owned) || owned.owner.PID != live.PID || owned.owner.Port != 5499 {
		l.release()
		t.Fatalf("lock naming live pid %d: %v; want it owned by that pid", live.PID, err)
	}

	recycled := live
	recycled.Start = "1" // the pid's earlier life
	if err := os.WriteFile(path, recycled.encode(), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := takeOwnerLock(path)
	if err != nil {
		t.Fatalf("lock naming a recycled pid: %v; want it taken over", err)
	}
	if err := l.record(6000); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if got := parseOwner(b); got.PID != os.Getpid() || got.Port != 6000 || !got.alive() {
		t.Fatalf("lock after takeover names %+v; want this process, port 6000", got)
	}
	// Held: a second taker is refused while it is held, and may take it
	// once released.
	if _, err := takeOwnerLock(path); !errors.As(err, &owned) {
		t.Fatalf("second take of a held lock: %v; want owned", err)
	}
	l.release()
	l2, err := takeOwnerLock(path)
	if err != nil {
		t.Fatalf("take after release: %v", err)
	}
	l2.release()
}
