package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Local runs each job as a process of this node: its own process group
// (so a cancel reaches every process it started), as the configured
// user, in its own working directory, with an environment built from an
// allow-list (see JobConfig), CUDA_VISIBLE_DEVICES set to the GPUs held
// for it, stdout and stderr together in a file under Dir whose tail the
// server is sent. The process outlives the agent: after a restart, Poll
// re-adopts it by pid and start time.
type Local struct {
	// Dir holds the jobs' output files.
	Dir string
	// WorkDir holds each job's working directory, job-<id>.
	WorkDir string
	// TailBytes bounds the output tail reported; 0 means 8 KiB.
	TailBytes int
	// MaxLogBytes bounds an output file: past it the file is cut back to
	// its tail; 0 means 64 MiB.
	MaxLogBytes int64

	job  JobConfig
	user *jobUser // nil: the agent's own

	mu        sync.Mutex
	children  map[string]*child // by pid, the processes this agent started
	cancelled map[string]bool   // by pid
}

var (
	_ Executor = (*Local)(nil)
	_ Finder   = (*Local)(nil)
)

type child struct {
	done  chan struct{}
	exit  int       // valid once done is closed
	ended time.Time // likewise
}

// NewLocal returns a local executor keeping output files in
// <stateDir>/output and the jobs' working directories in
// <stateDir>/jobs. It refuses to run jobs as root unless job says so.
func NewLocal(stateDir string, job JobConfig) (*Local, error) {
	u, err := job.resolve()
	if err != nil {
		return nil, fmt.Errorf("local executor: %w", err)
	}
	l := &Local{Dir: filepath.Join(stateDir, "output"), WorkDir: filepath.Join(stateDir, "jobs"), job: job, user: u}
	// Others may enter the state dir, not list it: its files are 0600,
	// its output directory 0700.
	if err := os.MkdirAll(stateDir, 0o711); err != nil {
		return nil, fmt.Errorf("local executor: state dir: %w", err)
	}
	if err := os.MkdirAll(l.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("local executor: output dir: %w", err)
	}
	// Others may enter, not list: the run-as user reaches its own job's
	// directory and nothing else of the agent's.
	if err := os.MkdirAll(l.WorkDir, 0o711); err != nil {
		return nil, fmt.Errorf("local executor: jobs dir: %w", err)
	}
	if err := reachable(filepath.Join(l.WorkDir, "job"), u); err != nil {
		return nil, fmt.Errorf("local executor: %w", err)
	}
	return l, nil
}

// Name implements Executor.
func (l *Local) Name() string { return "local" }

// exitWrapper is the script of the small sh that is each job's parent. It
// runs the command from its arguments ("$@": nothing in them is
// interpreted), without the exit file's descriptor, and writes the
// command's exit status (128 + the signal, for one a signal ended) to
// descriptor 3, the job's exit file, which the agent opened for it. So
// the status outlives an agent that is not there when the job ends: a
// restarted agent reads it instead of calling the job lost. The shell
// traps SIGTERM so that a cancel leaves it waiting for the command
// (which gets the default disposition back) and still writing the status.
const exitWrapper = `trap : TERM
"$@" 3>&-
s=$?
printf '%s\n' "$s" >&3
exit "$s"`

// Start implements Executor: it starts argv (looked up in PATH, never
// interpreted by a shell) under the exit-status wrapper, as the configured
// user in <WorkDir>/job-<id>, with the allow-listed environment, spec.Env
// and CUDA_VISIBLE_DEVICES.
func (l *Local) Start(ctx context.Context, spec Spec) (Handle, error) {
	if len(spec.Argv) == 0 {
		return Handle{}, errors.New("local: empty command")
	}
	base := filepath.Join(l.Dir, "job-"+fileSafe(spec.JobID))
	out, exitFile := base+".log", base+".exit"
	f, err := os.OpenFile(out, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return Handle{}, fmt.Errorf("local: output file: %w", err)
	}
	defer f.Close()
	// A program that is not there fails the start, not the job (a path
	// is left to the wrapper: it is relative to the job's directory).
	if _, err := exec.LookPath(spec.Argv[0]); err != nil && !strings.Contains(spec.Argv[0], "/") {
		fmt.Fprintf(f, "deepseed agent: could not start %q: %v\n", spec.Argv[0], err)
		return Handle{}, fmt.Errorf("local: start %s: %w", spec.Argv[0], err)
	}
	ef, err := os.OpenFile(exitFile, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return Handle{}, fmt.Errorf("local: exit file: %w", err)
	}
	defer ef.Close()
	// Not CommandContext: the job must outlive the agent's context.
	cmd := exec.Command("/bin/sh", append([]string{"-c", exitWrapper, "deepseed-job"}, spec.Argv...)...)
	cmd.ExtraFiles = []*os.File{ef}
	cmd.Dir = spec.Dir
	if cmd.Dir == "" {
		cmd.Dir = filepath.Join(l.WorkDir, "job-"+fileSafe(spec.JobID))
		if err := jobDir(cmd.Dir, l.user); err != nil {
			fmt.Fprintf(f, "deepseed agent: %v\n", err)
			return Handle{}, fmt.Errorf("local: %w", err)
		}
	}
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = f, f
	ids := make([]string, len(spec.GPUIDs))
	for i, g := range spec.GPUIDs {
		ids[i] = strconv.Itoa(g)
	}
	cmd.Env = jobEnviron(os.Environ(), spec, l.user, l.job.CollectorURL, "CUDA_VISIBLE_DEVICES="+strings.Join(ids, ","))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if u := l.user; u != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(f, "deepseed agent: could not start %q: %v\n", spec.Argv[0], err)
		return Handle{}, fmt.Errorf("local: start %s: %w", spec.Argv[0], err)
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	started, err := procStart(cmd.Process.Pid)
	if err != nil {
		started = time.Now() // the process may already have ended
	}
	c := &child{done: make(chan struct{})}
	l.mu.Lock()
	if l.children == nil {
		l.children = map[string]*child{}
	}
	l.children[pid] = c
	l.mu.Unlock()
	go func() {
		err := cmd.Wait()
		c.exit, c.ended = exitCode(cmd.ProcessState, err), time.Now()
		close(c.done)
	}()
	return Handle{Executor: "local", ExternalID: pid, StartedAt: started, OutputPath: out, ExitPath: exitFile}, nil
}

// Find implements Finder: the job's wrapper, found in /proc by its
// command line and its DEEPSEED_JOB_ID, or, once it has ended, its exit
// file.
func (l *Local) Find(ctx context.Context, jobID string) (Handle, bool, error) {
	base := filepath.Join(l.Dir, "job-"+fileSafe(jobID))
	h := Handle{Executor: "local", OutputPath: base + ".log", ExitPath: base + ".exit"}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return h, false, fmt.Errorf("local: find job %s: %w", jobID, err)
	}
	cmdline := []byte("/bin/sh\x00-c\x00" + exitWrapper + "\x00deepseed-job\x00")
	idVar := []byte("\x00DEEPSEED_JOB_ID=" + jobID + "\x00")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || ctx.Err() != nil {
			continue
		}
		c, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.HasPrefix(c, cmdline) {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(append([]byte{0}, env...), idVar) {
			continue
		}
		// The wrapper leads its process group; a child it forked has
		// the same command line until it execs.
		if pgid, err := syscall.Getpgid(pid); err != nil || pgid != pid {
			continue
		}
		started, err := procStart(pid)
		if err != nil {
			continue
		}
		h.ExternalID, h.StartedAt = e.Name(), started
		return h, true, nil
	}
	if _, ok := readExitFile(h.ExitPath); ok {
		return h, true, nil // ended: Poll reads its status
	}
	return h, false, nil
}

// exitCode is the process's exit status, or 128 + the signal that ended
// it, as a shell would show it.
func exitCode(ps *os.ProcessState, err error) int {
	if ps == nil {
		return -1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// Poll implements Executor. A process this agent started ends with its
// exit status: finished for 0, cancelled when a Cancel stopped it, failed
// otherwise. A process re-adopted after a restart is found by pid and
// start time; once it is gone its status is read from the exit file its
// wrapper wrote. Only a job that left none (its wrapper was killed with
// SIGKILL, or the machine went down) is lost: its outcome is unknown.
func (l *Local) Poll(ctx context.Context, h Handle) (Status, error) {
	st := Status{OutputTail: l.tail(h.OutputPath)}
	l.mu.Lock()
	c := l.children[h.ExternalID]
	cancelled := l.cancelled[h.ExternalID]
	l.mu.Unlock()
	if c != nil {
		select {
		case <-c.done:
			code := c.exit
			st.EndedAt = c.ended
			setEnded(&st, code, cancelled, "")
			l.mu.Lock()
			delete(l.children, h.ExternalID)
			delete(l.cancelled, h.ExternalID)
			l.mu.Unlock()
		default:
			st.State = StateRunning
		}
		return st, nil
	}
	if l.alive(h) {
		st.State = StateRunning
		return st, nil
	}
	if code, ok := readExitFile(h.ExitPath); ok {
		if fi, err := os.Stat(h.ExitPath); err == nil {
			st.EndedAt = fi.ModTime() // the wrapper wrote it as the command ended
		}
		setEnded(&st, code, cancelled, " (from the job's exit file: it ended while the agent was away)")
		return st, nil
	}
	if cancelled {
		st.State = StateCancelled
		return st, nil
	}
	st.State = StateLost
	st.Detail = "the process ended while the agent was away and left no exit status (killed with SIGKILL, or the machine restarted): its exit status is unknown"
	return st, nil
}

// alive reports whether the handle's process still runs: its pid exists
// and started when the handle says, so a reused pid is not taken for it.
func (l *Local) alive(h Handle) bool {
	pid, err := strconv.Atoi(h.ExternalID)
	if err != nil || pid <= 0 {
		return false
	}
	started, err := procStart(pid)
	if err != nil {
		return false
	}
	if d := started.Sub(h.StartedAt); d < -2*time.Second || d > 2*time.Second {
		return false
	}
	// A zombie has ended.
	b, err := os.ReadFile("/proc/" + h.ExternalID + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && len(s) > i+2 && s[i+2] == 'Z' {
		return false
	}
	return true
}

// Cancel implements Executor: SIGTERM to the job's process group, then
// SIGKILL once grace has passed with it still running.
func (l *Local) Cancel(ctx context.Context, h Handle, grace time.Duration) error {
	pid, err := strconv.Atoi(h.ExternalID)
	if err != nil || pid <= 0 {
		return fmt.Errorf("local: cancel: %q is not a pid", h.ExternalID)
	}
	if !l.alive(h) {
		return nil
	}
	l.mu.Lock()
	if l.cancelled == nil {
		l.cancelled = map[string]bool{}
	}
	l.cancelled[h.ExternalID] = true
	c := l.children[h.ExternalID]
	l.mu.Unlock()
	if err := syscall.Kill(-pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("local: SIGTERM to job process group %d: %w", pid, err)
	}
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if c != nil {
			select {
			case <-c.done:
				return nil
			default:
			}
		} else if !l.alive(h) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("local: SIGKILL to job process group %d: %w", pid, err)
			}
			return nil
		case <-tick.C:
		}
	}
}

// tail returns the last TailBytes of the output file, cutting the file
// back to its tail when it has grown past MaxLogBytes.
func (l *Local) tail(path string) string {
	n := l.TailBytes
	if n <= 0 {
		n = 8 << 10
	}
	limit := l.MaxLogBytes
	if limit <= 0 {
		limit = 64 << 20
	}
	return readTail(path, n, limit)
}

// procStart returns when process pid started, from /proc/<pid>/stat
// (field 22, clock ticks since boot) and the boot time in /proc/stat.
func procStart(pid int) (time.Time, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return time.Time{}, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return time.Time{}, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3 (state); starttime is field 22.
	if len(fields) < 20 {
		return time.Time{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields))
	}
	ticks, err := strconv.ParseInt(fields[19], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	boot, err := bootTime()
	if err != nil {
		return time.Time{}, err
	}
	const hz = 100 // USER_HZ, fixed at 100 on Linux
	return boot.Add(time.Duration(ticks) * time.Second / hz), nil
}

func bootTime() (time.Time, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, fmt.Errorf("/proc/stat btime: %w", err)
			}
			return time.Unix(sec, 0), nil
		}
	}
	return time.Time{}, errors.New("/proc/stat: no btime")
}

// setEnded sets the state of a job that ended with exit status code:
// cancelled if it was cancelled, finished on 0, else failed, its detail
// the status and where it was read (note).
func setEnded(st *Status, code int, cancelled bool, note string) {
	st.ExitCode = &code
	switch {
	case cancelled:
		st.State = StateCancelled
	case code == 0:
		st.State = StateFinished
	default:
		st.State = StateFailed
		st.Detail = fmt.Sprintf("exit status %d%s", code, note)
	}
}
