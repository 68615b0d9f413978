// Package localpg runs a private PostgreSQL cluster from the machine's
// PostgreSQL binaries (initdb, pg_ctl, postgres), for `deepseed serve`
// with no database URL, the chaos and collector benchmarks, and the test
// helper (store/storetest):
//
//  1. Describe the cluster: c := &localpg.Cluster{Dir: dir}.
//  2. Start it: url, err := c.Start(ctx), the URL of its "postgres"
//     database with the superuser's password.
//  3. Stop it when done: c.Stop().
//
// One process owns a data directory (a flock'd lock file beside it); a
// second process that starts the same directory connects to the owner's
// cluster as a client. The superuser logs in with a generated password
// (scram-sha-256) kept beside the data directory, never by trust. Where
// the installation has TimescaleDB, the cluster preloads it. A running
// cluster can start a streaming standby of itself (StartStandby).
//
// The package runs processes and reads files; it opens a database
// connection only to check that a cluster answers as its superuser and to
// give a cluster made with trust authentication a password, through pgx's
// wire-protocol layer (pgconn), not pgx itself.
package localpg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Cluster is a private PostgreSQL cluster started from the machine's
// PostgreSQL binaries (initdb, pg_ctl, postgres). `deepseed serve` uses it
// when no database URL is given, and the test helper uses it when
// DEEPSEED_TEST_DATABASE_URL is unset.
//
// PostgreSQL refuses to run as root; when the current user is root the
// cluster runs as the "postgres" user (or "nobody" when there is none) and
// its data directory is handed to that user.
type Cluster struct {
	// Dir is the data directory. It is created and initialised when empty
	// and kept across restarts.
	Dir string
	// Port to listen on (127.0.0.1 only); 0 picks a free one.
	Port int
	// Logger receives progress messages; nil discards them.
	Logger *slog.Logger
	// Fsync turns on fsync; the test helper leaves it off for speed.
	Fsync bool

	// WithoutTimescale keeps the timescaledb library out of
	// shared_preload_libraries even where the machine has it.
	WithoutTimescale bool
	// Settings are extra server settings (name → value) passed with -c.
	Settings map[string]string

	bin      string
	cred     *syscall.Credential
	lock     *ownerLock
	password string // the superuser's, see auth.go
}

// ErrNoPostgres says that no PostgreSQL server binaries were found.
var ErrNoPostgres = errors.New("no PostgreSQL server binaries found (install PostgreSQL, e.g. apt-get install postgresql, or set DEEPSEED_PG_BIN to the directory holding initdb and pg_ctl)")

// FindBin returns the directory holding initdb, pg_ctl and postgres:
// $DEEPSEED_PG_BIN, then $PATH, then the newest /usr/lib/postgresql/N/bin.
func FindBin() (string, error) {
	if d := os.Getenv("DEEPSEED_PG_BIN"); d != "" {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "pg_ctl")) {
			return d, nil
		}
		return "", fmt.Errorf("DEEPSEED_PG_BIN=%s: initdb or pg_ctl missing", d)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		d := filepath.Dir(p)
		if isExec(filepath.Join(d, "pg_ctl")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	var best string
	bestV := -1
	for _, root := range []string{"/usr/lib/postgresql", "/usr/local/pgsql", "/opt/homebrew/opt/postgresql"} {
		entries, _ := os.ReadDir(root)
		for _, e := range entries {
			v, err := strconv.Atoi(e.Name())
			d := filepath.Join(root, e.Name(), "bin")
			if err == nil && v > bestV && isExec(filepath.Join(d, "initdb")) {
				best, bestV = d, v
			}
		}
		if d := filepath.Join(root, "bin"); best == "" && isExec(filepath.Join(d, "initdb")) {
			best = d
		}
	}
	if best == "" {
		return "", ErrNoPostgres
	}
	return best, nil
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// Start initialises the cluster if needed and starts it. It returns the
// connection URL of the "postgres" database.
//
// One process owns a cluster: the one that started it, recorded in a lock
// file beside the data directory (Dir + ".owner"). Start called while a
// live process owns the cluster does not touch it: it waits until the
// cluster answers and connects as a client, on the port the owner
// recorded; Stop then leaves the cluster running. A lock whose owner died
// is taken over, and a cluster that dead owner left running is adopted as
// it is.
func (lp *Cluster) Start(ctx context.Context) (string, error) {
	log := lp.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	bin, err := FindBin()
	if err != nil {
		return "", err
	}
	lp.Dir = filepath.Clean(lp.Dir)
	if err := os.MkdirAll(filepath.Dir(lp.Dir), 0o755); err != nil {
		return "", fmt.Errorf("local postgres: create parent of data dir: %w", err)
	}
	waited := false
	for wait := 100 * time.Millisecond; ; wait = min(wait*2, time.Second) {
		lock, err := takeOwnerLock(lp.lockPath())
		var owned *errOwned
		if err != nil && !errors.As(err, &owned) {
			return "", fmt.Errorf("local postgres: %w", err)
		}
		if lock != nil {
			lp.lock = lock
			break
		}
		// Another live process owns the cluster: use it as a client once
		// it answers. Should that owner go away meanwhile, take over.
		port := owned.owner.Port
		if port == 0 {
			port = postmasterPort(lp.Dir)
		}
		if lp.password == "" {
			_ = lp.loadPassword() // written by the owner before its cluster answers
		}
		if port != 0 && lp.password != "" && lp.pingPostgres(ctx, port) == nil {
			if lp.Port != 0 && lp.Port != port {
				log.Warn("private PostgreSQL runs on another port than asked; using its port", "asked", lp.Port, "port", port)
			}
			lp.Port = port
			log.Info("private PostgreSQL is run by another process; connecting to it as a client (it stops when that process exits)",
				"dir", lp.Dir, "owner_pid", owned.owner.PID, "port", port)
			return lp.URL("postgres"), nil
		}
		if !waited {
			log.Info("private PostgreSQL is run by another process that has not started it yet; waiting", "dir", lp.Dir, "owner_pid", owned.owner.PID)
			waited = true
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("local postgres: %s is owned by process %d, whose cluster did not answer: %w", lp.Dir, owned.owner.PID, ctx.Err())
		case <-time.After(wait):
		}
	}
	url, err := lp.startOwned(ctx, bin, log)
	if err != nil {
		lp.lock.release()
		lp.lock = nil
		return "", err
	}
	return url, nil
}

// Owner reports whether this Cluster started (or adopted) the
// cluster and will stop it, rather than being a client of another
// process's cluster.
func (lp *Cluster) Owner() bool { return lp.lock != nil }

func (lp *Cluster) lockPath() string { return lp.Dir + ".owner" }

// startOwned starts the cluster as its owner, the lock being held.
func (lp *Cluster) startOwned(ctx context.Context, bin string, log *slog.Logger) (string, error) {
	lp.bin = bin
	if err := os.MkdirAll(lp.Dir, 0o700); err != nil {
		return "", fmt.Errorf("local postgres: create data dir: %w", err)
	}
	if os.Geteuid() == 0 {
		cred, uid, gid, name, err := unprivileged()
		if err != nil {
			return "", fmt.Errorf("local postgres: %w", err)
		}
		lp.cred = cred
		// Every parent directory must be traversable by that user; serve
		// says which is not rather than change a directory it did not
		// create.
		if err := traversable(lp.Dir, uid, gid, name); err != nil {
			return "", err
		}
		if err := chownTree(lp.Dir, uid, gid); err != nil {
			return "", fmt.Errorf("local postgres: hand data dir to uid %d: %w", uid, err)
		}
	}
	if _, err := os.Stat(filepath.Join(lp.Dir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		// A new cluster cannot be running yet: a taken port is another
		// process's, and is said before initdb, not in PostgreSQL's log.
		if err := portFree(lp.Port); err != nil {
			return "", err
		}
		log.Info("initialising private PostgreSQL cluster", "dir", lp.Dir)
		if err := lp.initdb(ctx); err != nil {
			return "", err
		}
	} else if err := lp.loadPassword(); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	// A cluster made before passwords (trust) has none yet: secureLegacy
	// gives it one once it answers.
	// A cluster still running from an owner that died without stopping it
	// (kill -9): its owner lock is free, so nobody else owns it; adopt it
	// as it runs, so that clients connected to it keep working. pg_ctl
	// itself handles a stale postmaster.pid whose process is gone.
	if err := lp.command(ctx, "pg_ctl", "-D", lp.Dir, "status").Run(); err == nil {
		if port := postmasterPort(lp.Dir); port != 0 && lp.pingPostgres(ctx, port) == nil {
			lp.Port = port
			if err := lp.lock.record(port); err != nil {
				return "", fmt.Errorf("local postgres: %w", err)
			}
			log.Warn("adopting the private PostgreSQL left running by an earlier process", "dir", lp.Dir, "port", port)
			if err := lp.secureLegacy(ctx, log); err != nil {
				return "", err
			}
			return lp.URL("postgres"), nil
		}
		log.Warn("private PostgreSQL left running by an earlier process does not answer; restarting it", "dir", lp.Dir)
		if out, err := lp.command(ctx, "pg_ctl", "-D", lp.Dir, "-m", "fast", "-w", "-t", "60", "stop").CombinedOutput(); err != nil {
			return "", fmt.Errorf("local postgres: stop leftover server: %w: %s", err, lastLines(out))
		}
	}
	if lp.Port == 0 {
		p, err := freePort()
		if err != nil {
			return "", fmt.Errorf("local postgres: pick port: %w", err)
		}
		lp.Port = p
	}
	if err := portFree(lp.Port); err != nil {
		return "", err
	}
	if err := lp.lock.record(lp.Port); err != nil {
		return "", fmt.Errorf("local postgres: %w", err)
	}
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -c unix_socket_directories='' -c max_connections=200", lp.Port)
	if !lp.Fsync {
		opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
	}
	opts += lp.timescaleOptions(log)
	logFile := filepath.Join(lp.Dir, "server.log")
	cmd := lp.command(ctx, "pg_ctl", "-D", lp.Dir, "-o", opts, "-l", logFile, "-w", "-t", "60", "start")
	if _, set := os.LookupEnv(mallocTrimEnv); !set {
		cmd.Env = append(cmd.Env, mallocTrimEnv+"="+mallocTrimBytes)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		tail, _ := os.ReadFile(logFile)
		return "", fmt.Errorf("local postgres: pg_ctl start: %w: %s %s", err, lastLines(out), lastLines(tail))
	}
	log.Info("private PostgreSQL started", "dir", lp.Dir, "port", lp.Port)
	if err := lp.secureLegacy(ctx, log); err != nil {
		return "", err
	}
	return lp.URL("postgres"), nil
}

// ErrPortTaken is the error of Start when the cluster's port on 127.0.0.1
// is held by another process.
var ErrPortTaken = errors.New("port taken by another process")

// portFree returns ErrPortTaken, wrapped with the port, when another
// process listens on 127.0.0.1:port; 0 (pick one) is always free.
func portFree(port int) error {
	if port == 0 {
		return nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("local postgres: 127.0.0.1:%d: %w", port, ErrPortTaken)
	}
	if err == nil {
		l.Close()
	}
	return nil
}

// Stop shuts the cluster down (fast mode: open sessions are ended, data
// is flushed) and gives up ownership. A client of another process's
// cluster leaves it running.
func (lp *Cluster) Stop() error {
	if lp.lock == nil {
		return nil
	}
	defer func() {
		lp.lock.release()
		lp.lock = nil
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := lp.command(ctx, "pg_ctl", "-D", lp.Dir, "-m", "fast", "-w", "stop").CombinedOutput(); err != nil {
		return fmt.Errorf("local postgres: pg_ctl stop: %w: %s", err, lastLines(out))
	}
	return nil
}

// A backend frees the memory of each statement when it ends, and glibc's
// malloc hands the top of the heap back to the kernel whenever more than
// 128 KiB of it is free. Under ingest that is several brk calls per batch
// per backend, each unmapping pages and, on a virtual machine, flushing
// the TLB of every CPU the backend ran on: a quarter of PostgreSQL's CPU
// time in the ingest benchmark. Keeping up to 8 MiB per backend makes
// both ingest and raw COPY faster (see the ingest benchmark in the
// README). The environment wins when it sets the variable; other C
// libraries ignore it.
const (
	mallocTrimEnv   = "MALLOC_TRIM_THRESHOLD_"
	mallocTrimBytes = "8388608"
)

func (lp *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(lp.bin, name), args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.Dir = lp.Dir
	if lp.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: lp.cred}
		cmd.Dir = "/"
	}
	return cmd
}

func unprivileged() (*syscall.Credential, int, int, string, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid, gid, name, nil
	}
	return nil, 0, 0, "", errors.New("running as root and no postgres or nobody user to run PostgreSQL as")
}

func chownTree(dir string, uid, gid int) error {
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lastLines(b []byte) string {
	s := strings.TrimSpace(string(b))
	lines := strings.Split(s, "\n")
	if len(lines) > 8 {
		lines = lines[len(lines)-8:]
	}
	return strings.Join(lines, "\n")
}
