// Package slurmtest starts a real single-node Slurm cluster for tests, from
// the machine's Slurm and MUNGE binaries (Debian: apt-get install
// slurm-wlm munge), on loopback, in a temporary directory.
//
// Usage:
//  1. c := slurmtest.Start(t) — munged, slurmctld and slurmd run until the
//     test ends; the node has c.GPUs GPUs as a generic resource.
//  2. Point the code under test at c.Bin's commands with c.Env in their
//     environment (it names the cluster's slurm.conf).
//
// Where the binaries are missing or the cluster cannot start, Start skips
// the test and says why (with the daemons' logs);
// DEEPSEED_TEST_SLURM=require makes that a failure instead, and
// DEEPSEED_TEST_SLURM=off skips without trying.
//
// It runs as root or as an ordinary user: SlurmUser and SlurmdUser are
// the user running the tests, so jobs run as that user (checked both ways).
//
// Nothing here touches the machine's own Slurm or MUNGE: the MUNGE key,
// socket, state directories, ports and logs are all the cluster's own.
// The cluster has no cgroups (ProctrackType=proctrack/pgid,
// TaskPlugin=task/none) and no accounting database, so sacct answers that
// accounting is disabled. proctrack/pgid rather than proctrack/linuxproc:
// linuxproc finds a job's processes by walking the process tree from
// slurmstepd, so a process whose parent was killed first is reparented
// to init and escapes every later signal (seen here: a job's shell loop
// outlived its cancelled job); a process group keeps it. When the cluster
// stops, any process still carrying its SLURM_CONF is killed and the test
// fails, so a leak is never silent.
package slurmtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// EnvMode is the environment variable that chooses what happens when no
// cluster can be started: auto (skip, the default), require (fail), off
// (skip without trying).
const EnvMode = "DEEPSEED_TEST_SLURM"

// Binaries are the paths of the Slurm and MUNGE commands.
type Binaries struct {
	Sbatch, Squeue, Sacct, Scancel, Scontrol, Sinfo string
	Slurmctld, Slurmd, Munged                       string
}

// Cluster is a running single-node Slurm.
type Cluster struct {
	Dir  string   // the cluster's directory: configuration, state, logs, MUNGE
	Conf string   // its slurm.conf
	Env  []string // SLURM_CONF=Conf, for Slurm's client commands
	Node string   // the one node's name
	GPUs int      // GPUs the node has (gres/gpu)
	User string   // SlurmUser, the user the tests run as
	Bin  Binaries

	procs []*daemon // munged, slurmctld, slurmd, in start order
}

// daemon is a started daemon; done closes when it has exited.
type daemon struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // how it exited, once done is closed
}

// Start starts a cluster that runs until t ends, or skips t (fails it
// under DEEPSEED_TEST_SLURM=require) saying why it could not.
func Start(t testing.TB) *Cluster {
	t.Helper()
	mode := os.Getenv(EnvMode)
	switch mode {
	case "", "auto", "require":
	case "off":
		t.Skipf("slurmtest: %s=off", EnvMode)
	default:
		t.Fatalf("slurmtest: %s=%q: want auto, require or off", EnvMode, mode)
	}
	c, err := start(t)
	if err != nil {
		if mode == "require" {
			t.Fatalf("slurmtest: no Slurm cluster (%s=require): %v", EnvMode, err)
		}
		t.Skipf("slurmtest: skipped, no Slurm cluster: %v", err)
	}
	return c
}

// ErrNotInstalled is returned (wrapped) when a binary is missing.
var ErrNotInstalled = errors.New("not installed (Debian: apt-get install slurm-wlm munge)")

func findBinaries() (Binaries, error) {
	var b Binaries
	var missing []string
	for _, f := range []struct {
		p    *string
		name string
	}{
		{&b.Sbatch, "sbatch"}, {&b.Squeue, "squeue"}, {&b.Sacct, "sacct"}, {&b.Scancel, "scancel"},
		{&b.Scontrol, "scontrol"}, {&b.Sinfo, "sinfo"},
		{&b.Slurmctld, "slurmctld"}, {&b.Slurmd, "slurmd"}, {&b.Munged, "munged"},
	} {
		p, err := exec.LookPath(f.name)
		if err != nil {
			// The daemons live in sbin, which a user's PATH may lack.
			for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/sbin"} {
				if fi, serr := os.Stat(filepath.Join(dir, f.name)); serr == nil && fi.Mode()&0o111 != 0 {
					p, err = filepath.Join(dir, f.name), nil
					break
				}
			}
		}
		if err != nil {
			missing = append(missing, f.name)
			continue
		}
		*f.p = p
	}
	if len(missing) > 0 {
		return b, fmt.Errorf("%s %w", strings.Join(missing, ", "), ErrNotInstalled)
	}
	return b, nil
}

func start(t testing.TB) (*Cluster, error) {
	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	u, err := user.Current()
	if err != nil {
		return nil, fmt.Errorf("current user: %w", err)
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("hostname: %w", err)
	}
	host, _, _ = strings.Cut(host, ".")
	// Not t.TempDir: munged wants the directory of its socket, and the
	// directories above it, to be searchable by every user.
	dir, err := os.MkdirTemp("", "deepseed-slurm-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, Conf: filepath.Join(dir, "slurm.conf"), Node: "node0", GPUs: 2, User: u.Username, Bin: bin}
	c.Env = []string{"SLURM_CONF=" + c.Conf}
	t.Cleanup(func() {
		c.stop(t)
		if !t.Failed() {
			_ = os.RemoveAll(dir)
		} else {
			t.Logf("slurmtest: cluster directory kept: %s", dir)
		}
	})
	if err := c.setup(host); err != nil {
		return nil, err
	}
	if err := c.startMunge(); err != nil {
		return nil, err
	}
	if err := c.startSlurm(); err != nil {
		return nil, err
	}
	t.Logf("slurmtest: Slurm started: node %s idle with gres gpu:%d, %s", c.Node, c.GPUs, c.Conf)
	return c, nil
}

// setup writes the MUNGE key and Slurm's configuration.
func (c *Cluster) setup(host string) error {
	for _, d := range []struct {
		name string
		mode os.FileMode
	}{{"", 0o755}, {"munge", 0o700}, {"run", 0o755}, {"state", 0o700}, {"spool", 0o755}, {"log", 0o755}, {"gpu", 0o755}} {
		p := filepath.Join(c.Dir, d.name)
		if err := os.MkdirAll(p, d.mode); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}
	key := make([]byte, 1024)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "munge", "munge.key"), key, 0o400); err != nil {
		return fmt.Errorf("munge key: %w", err)
	}
	// Slurm's gres/gpu plugin drops every GPU that has no File (slurmd:
	// "Removing file-less GPU ... from final GRES list"; a bare Count is
	// kept only for other GRES names), and the node is then refused for
	// reporting fewer GPUs than slurm.conf gives it. So each GPU is an
	// empty plain file: no device, no driver, never opened, and with no
	// cgroups nothing is constrained by it.
	for i := range c.GPUs {
		if err := os.WriteFile(filepath.Join(c.Dir, "gpu", fmt.Sprintf("gpu%d", i)), nil, 0o644); err != nil {
			return err
		}
	}
	ctldPort, err := freePort()
	if err != nil {
		return err
	}
	slurmdPort, err := freePort()
	if err != nil {
		return err
	}
	conf := fmt.Sprintf(`# A single-node Slurm for DeepSeed's tests, on loopback.
ClusterName=deepseedtest
SlurmctldHost=%[1]s(127.0.0.1)
SlurmctldPort=%[2]d
SlurmdPort=%[3]d
SlurmUser=%[4]s
SlurmdUser=%[4]s
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=%[5]s/run/munge.sock
StateSaveLocation=%[5]s/state
SlurmdSpoolDir=%[5]s/spool
SlurmctldPidFile=%[5]s/slurmctld.pid
SlurmdPidFile=%[5]s/slurmd.pid
SlurmctldLogFile=%[5]s/log/slurmctld.log
SlurmdLogFile=%[5]s/log/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
KillWait=5
SlurmdTimeout=30
NodeName=%[6]s NodeHostname=%[1]s NodeAddr=127.0.0.1 CPUs=%[7]d RealMemory=1000 Gres=gpu:%[8]d State=UNKNOWN
PartitionName=debug Nodes=%[6]s Default=YES MaxTime=INFINITE State=UP
`, host, ctldPort, slurmdPort, c.User, c.Dir, c.Node, runtime.NumCPU(), c.GPUs)
	if err := os.WriteFile(c.Conf, []byte(conf), 0o644); err != nil {
		return err
	}
	gres := fmt.Sprintf("NodeName=%s Name=gpu Count=%d File=%s/gpu/gpu[0-%d]\n", c.Node, c.GPUs, c.Dir, c.GPUs-1)
	return os.WriteFile(filepath.Join(c.Dir, "gres.conf"), []byte(gres), 0o644)
}

func (c *Cluster) startMunge() error {
	m := filepath.Join(c.Dir, "munge")
	sock := filepath.Join(c.Dir, "run", "munge.sock")
	if err := c.spawn("munged", c.Bin.Munged, "--foreground",
		"--key-file="+filepath.Join(m, "munge.key"), "--socket="+sock,
		"--pid-file="+filepath.Join(m, "munged.pid"), "--seed-file="+filepath.Join(m, "munged.seed"),
		"--log-file="+filepath.Join(m, "munged.log")); err != nil {
		return err
	}
	return c.waitFor(2*time.Minute, "munged socket", func() (bool, error) {
		_, err := os.Stat(sock)
		return err == nil, nil
	})
}

func (c *Cluster) startSlurm() error {
	if err := c.spawn("slurmctld", c.Bin.Slurmctld, "-D", "-f", c.Conf); err != nil {
		return err
	}
	if err := c.spawn("slurmd", c.Bin.Slurmd, "-D", "-N", c.Node, "-f", c.Conf); err != nil {
		return err
	}
	var last string
	return c.waitFor(3*time.Minute, "node idle in sinfo", func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := c.Command(ctx, c.Bin.Sinfo, "--noheader", "--nodes="+c.Node, "--format=%T %G")
		last = strings.TrimSpace(out)
		if err != nil {
			return false, nil // slurmctld not listening yet
		}
		st, _, _ := strings.Cut(last, " ")
		if strings.HasPrefix(st, "inval") || strings.HasPrefix(st, "drain") {
			return false, fmt.Errorf("node %s is %q", c.Node, last)
		}
		return st == "idle", nil
	})
}

// spawn starts a daemon in the foreground, its output in log/<name>.out.
func (c *Cluster) spawn(name, bin string, args ...string) error {
	out, err := os.Create(filepath.Join(c.Dir, "log", name+".out"))
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	d := &daemon{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { d.err = cmd.Wait(); close(d.done) }()
	c.procs = append(c.procs, d)
	return nil
}

// waitFor polls ok until it holds, a daemon exits, or d passes; errors
// carry the daemons' logs.
func (c *Cluster) waitFor(d time.Duration, what string, ok func() (bool, error)) error {
	deadline := time.Now().Add(d)
	for {
		done, err := ok()
		if err != nil {
			return fmt.Errorf("%s: %w%s", what, err, c.logs())
		}
		if done {
			return nil
		}
		for _, p := range c.procs {
			select {
			case <-p.done:
				return fmt.Errorf("%s: %s exited (%v)%s", what, p.name, p.err, c.logs())
			default:
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not after %v%s", what, d, c.logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// logs returns the tails of the daemons' logs, for a message.
func (c *Cluster) logs() string {
	var b strings.Builder
	for _, f := range []string{"log/munged.out", "munge/munged.log", "log/slurmctld.out", "log/slurmctld.log", "log/slurmd.out", "log/slurmd.log"} {
		data, err := os.ReadFile(filepath.Join(c.Dir, f))
		if err != nil || len(bytes.TrimSpace(data)) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 12 {
			lines = lines[len(lines)-12:]
		}
		fmt.Fprintf(&b, "\n--- %s:\n%s", f, strings.Join(lines, "\n"))
	}
	return b.String()
}

// Command runs a Slurm client command (a path from c.Bin) against the
// cluster and returns its standard output; the error carries its
// standard error.
func (c *Cluster) Command(ctx context.Context, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), c.Env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// stop cancels every job of the cluster, waits for them to leave the
// queue (slurmstepd outlives slurmd otherwise), then stops slurmd,
// slurmctld and munged.
func (c *Cluster) stop(t testing.TB) {
	if len(c.procs) == 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if _, err := c.Command(ctx, c.Bin.Scancel, "--user="+c.User, "--signal=KILL"); err != nil {
			t.Logf("slurmtest: scancel: %v", err)
		}
		for ctx.Err() == nil {
			out, err := c.Command(ctx, c.Bin.Squeue, "--noheader", "--format=%i")
			if err != nil || strings.TrimSpace(out) == "" {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		cancel()
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Logf("slurmtest: %s did not stop on SIGTERM; killing it", p.name)
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	}
	c.procs = nil
	// Jobs inherit sbatch's environment, SLURM_CONF included: any process
	// still carrying this cluster's escaped Slurm's tracking.
	for _, pid := range c.strays() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("slurmtest: process %d of a job outlived the cluster; killed it", pid)
	}
}

// strays returns the processes whose environment names this cluster's
// slurm.conf.
func (c *Cluster) strays() []int {
	want := []byte("SLURM_CONF=" + c.Conf + "\x00")
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && bytes.Contains(append(env, 0), want) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
