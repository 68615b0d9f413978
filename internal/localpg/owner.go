package localpg

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// ownerLock records which process owns a private PostgreSQL cluster: the
// one that started it and alone stops it. The lock is a file beside the
// cluster's data directory, held with flock(2) for the owner's lifetime,
// so the kernel frees it when the owner dies, kill -9 included. The file
// names the owner (pid, process start time, boot id) and the cluster's
// port, so that a second process can connect to the cluster as a client
// and a human can see who holds it.
type ownerLock struct {
	path string
	f    *os.File
}

// ownerInfo is the content of a lock file.
type ownerInfo struct {
	PID   int
	Start string // field 22 of /proc/PID/stat: clock ticks since boot
	Boot  string // /proc/sys/kernel/random/boot_id
	Port  int
}

func (o ownerInfo) encode() []byte {
	return []byte(fmt.Sprintf("pid=%d\nstart=%s\nboot=%s\nport=%d\n", o.PID, o.Start, o.Boot, o.Port))
}

func parseOwner(b []byte) ownerInfo {
	var o ownerInfo
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok {
			continue
		}
		switch k {
		case "pid":
			o.PID, _ = strconv.Atoi(v)
		case "start":
			o.Start = v
		case "boot":
			o.Boot = v
		case "port":
			o.Port, _ = strconv.Atoi(v)
		}
	}
	return o
}

// self describes the current process.
func self(port int) ownerInfo {
	pid := os.Getpid()
	return ownerInfo{PID: pid, Start: procStart(pid), Boot: bootID(), Port: port}
}

// procStart returns the start time of process pid (field 22 of
// /proc/PID/stat), "" where /proc is not available.
func procStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields after its closing parenthesis.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); field 22 is f[19].
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// alive reports whether the process o names still runs: same pid, same
// start time and same boot, so a recycled pid is not mistaken for it.
func (o ownerInfo) alive() bool {
	if o.PID <= 0 {
		return false
	}
	if o.Boot != "" && o.Boot != bootID() {
		return false
	}
	if o.Start != "" {
		return procStart(o.PID) == o.Start
	}
	err := syscall.Kill(o.PID, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// errOwned says that a live process other than this one owns the cluster.
type errOwned struct{ owner ownerInfo }

func (e *errOwned) Error() string {
	return fmt.Sprintf("owned by process %d", e.owner.PID)
}

// takeOwnerLock takes the lock at path for this process, or returns an
// *errOwned naming the live owner. A lock whose owner is dead is taken
// over. The lock is held until release.
func takeOwnerLock(path string) (*ownerLock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open owner lock %s: %w", path, err)
	}
	prev, _ := os.ReadFile(path)
	old := parseOwner(prev)
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	switch {
	case errors.Is(err, syscall.EWOULDBLOCK):
		f.Close()
		return nil, &errOwned{owner: old}
	case err != nil:
		// A file system without flock: the recorded owner's liveness
		// decides alone.
		if old.PID != os.Getpid() && old.alive() {
			f.Close()
			return nil, &errOwned{owner: old}
		}
	default:
		// Locked. A live owner named in the file that does not hold the
		// lock means flock is not honoured here: stay on the safe side.
		if old.PID != os.Getpid() && old.alive() {
			f.Close()
			return nil, &errOwned{owner: old}
		}
	}
	return &ownerLock{path: path, f: f}, nil
}

// record writes this process and the cluster's port into the lock file.
func (l *ownerLock) record(port int) error {
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("write owner lock %s: %w", l.path, err)
	}
	if _, err := l.f.WriteAt(self(port).encode(), 0); err != nil {
		return fmt.Errorf("write owner lock %s: %w", l.path, err)
	}
	return l.f.Sync()
}

// release empties the lock file and frees the lock.
func (l *ownerLock) release() {
	if l == nil || l.f == nil {
		return
	}
	_ = l.f.Truncate(0)
	_ = l.f.Close()
	l.f = nil
}

// postmasterPort reads the port of a running cluster from its
// postmaster.pid (line 4), 0 when unknown.
func postmasterPort(dataDir string) int {
	b, err := os.ReadFile(dataDir + "/postmaster.pid")
	if err != nil {
		return 0
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 4 {
		return 0
	}
	p, _ := strconv.Atoi(strings.TrimSpace(lines[3]))
	return p
}
