package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/deepseed/deepseed/internal/localpg"
	"github.com/deepseed/deepseed/store"
)

const chaosNotes = `
The chaos bench runs the whole pipeline on this machine, loopback only: a
private PostgreSQL, a deepseed server and a deepseed collector, each a real
process. A sender posts step records to the collector's hook receiver at
--rate records a second, as the hook does (a batch the collector does not
acknowledge is sent again), and remembers every record acknowledged. Then,
--cycles times each, PostgreSQL, the server and the collector are killed
with SIGKILL and started again; then the database turns read-only for 6 s
(the server must answer 503 and say it is not ready, the collector keep
the batches); with --tmpfs-db (root), its data directory's file system is
then filled for 8 s and emptied again (PostgreSQL is started again if it
stopped); then the server stays down while the collector's spool fills
(--spool-max-bytes, or a 5 MiB tmpfs with --tmpfs-spool when run as root),
and the collector, sampling the host every 50 ms, drops its own samples to
make room and then answers the hook 503, never deleting an acknowledged
record;
then the server and the collector are attacked in turn by slow and hostile
clients (40 silent 32 MiB bodies, 500 trickling bodies, 16 concurrent gzip
bombs twice) while another client keeps posting. At the end it waits for
the pipeline to drain and counts, by SQL, the acknowledged records that are
not stored (lost) and the records stored twice (duplicated), per fault. It
exits 1 if any record was lost, duplicated or dead-lettered, if the server
answered 500, if /readyz stayed 200 while the database refused writes, or
if under an attack a process went past --max-rss-mb, another client's
request was not answered or an attacker was not let go.`

// chaos is one run of the chaos bench.
type chaos struct {
	bin, dir, token string
	rate            int
	spoolMax        int64
	pg              *localpg.Cluster
	dbURL           string
	serverPort      int
	hookPort        int
	metricsPort     int
	// spoolFull is the collector's /metrics at the end of the spool-full
	// phase, before the server comes back.
	spoolFull       map[string]float64
	server, collect *exec.Cmd
	logs            map[string]*bytes.Buffer
	run             string

	// readOnly503 is set once /readyz answered 503 while the database
	// was read-only, diskFull503 while its disk was full.
	readOnly503, diskFull503 bool
	// dbMount is the tmpfs of PostgreSQL's data directory with --tmpfs-db.
	dbMount string
	attacks []*attackResult
	maxRSS  int64

	mu       sync.Mutex
	phase    string
	acked    map[int64]string // step → the phase it was acknowledged in
	deferred map[string]int   // 503 answers by phase
	unreach  map[string]int   // posts without an answer by phase
}

func runChaos(ctx context.Context, args []string) error {
	f := newEnvFlags("bench chaos")
	cycles := f.String("cycles", "", "10", "kills of each process")
	rate := f.String("rate", "", "200", "step records a second the sender posts")
	binFlag := f.String("binary", "", "", "deepseed binary to run (default: this one)")
	spoolMax := f.String("spool-max-bytes", "", "65536", "the collector's spool bound for the spool-full phase")
	tmpfs := f.Bool("tmpfs-spool", "", false, "put the spool on a 5 MiB tmpfs (needs root)")
	tmpfsDB := f.Bool("tmpfs-db", "", false, "put PostgreSQL's data directory on a 1 GiB tmpfs and add a phase where it is full (needs root)")
	keep := f.Bool("keep", "", false, "keep the working directory")
	attacks := f.Bool("attacks", "", true, "attack the server and the collector with slow and hostile clients")
	maxRSS := f.String("max-rss-mb", "", "300", "resident memory each process may reach under the attacks")
	f.setUsage("deepseed bench chaos [flags]", "Kill PostgreSQL, the server and the collector under load and count what was lost.", chaosNotes)
	if err := f.parse(args); err != nil {
		return err
	}
	n, err1 := strconv.Atoi(*cycles)
	r, err2 := strconv.Atoi(*rate)
	sm, err3 := strconv.ParseInt(*spoolMax, 10, 64)
	rss, err4 := strconv.ParseInt(*maxRSS, 10, 64)
	if err := errors.Join(err1, err2, err3, err4); err != nil || n < 1 || r < 10 || sm < 4096 || rss < 1 {
		return fmt.Errorf("bench chaos: bad flags: want --cycles ≥ 1, --rate ≥ 10, --spool-max-bytes ≥ 4096, --max-rss-mb ≥ 1")
	}
	bin := *binFlag
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("bench chaos: %w", err)
		}
		bin = exe
	}
	dir, err := benchDir("deepseed-chaos-")
	if err != nil {
		return fmt.Errorf("bench chaos: %w", err)
	}
	if !*keep {
		defer os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "working directory: %s\n", dir)
	}
	c := &chaos{bin: bin, dir: dir, token: "chaos-" + randomTag(), rate: r, spoolMax: sm, logs: map[string]*bytes.Buffer{},
		acked: map[int64]string{}, deferred: map[string]int{}, unreach: map[string]int{}, run: "chaos-" + randomTag(),
		maxRSS: rss << 20}
	spool := filepath.Join(dir, "spool")
	if err := os.MkdirAll(spool, 0o755); err != nil {
		return fmt.Errorf("bench chaos: %w", err)
	}
	if *tmpfs {
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", spool).CombinedOutput(); err != nil {
			return fmt.Errorf("bench chaos: mount a tmpfs spool (root needed): %v: %s", err, out)
		}
		defer exec.Command("umount", spool).Run()
		c.spoolMax = 1 << 30 // the tmpfs is the bound
	}
	defer c.stopAll()
	if *tmpfsDB {
		if err := c.mountDB(); err != nil {
			return err
		}
		defer exec.Command("umount", "-l", c.dbMount).Run()
	}
	if err := c.startPostgres(ctx); err != nil {
		return err
	}
	c.serverPort, c.hookPort, c.metricsPort = freeLoopbackPort(), freeLoopbackPort(), freeLoopbackPort()
	if err := c.startServer(ctx); err != nil {
		return err
	}
	if err := c.startCollector(ctx); err != nil {
		return err
	}

	sendCtx, stopSend := context.WithCancel(ctx)
	sendDone := make(chan struct{})
	go func() { defer close(sendDone); c.send(sendCtx) }()

	faults := []struct {
		name string
		kill func(context.Context) error
	}{
		{"postgres", c.killPostgres},
		{"server", c.killServer},
		{"collector", c.killCollector},
	}
	for _, fault := range faults {
		for i := 1; i <= n; i++ {
			c.setPhase(fault.name)
			sleepCtx(ctx, 1500*time.Millisecond)
			fmt.Fprintf(os.Stderr, "kill -9 %s (%d/%d)\n", fault.name, i, n)
			if err := fault.kill(ctx); err != nil {
				stopSend()
				<-sendDone
				return fmt.Errorf("bench chaos: %s: %w", fault.name, err)
			}
		}
	}
	// The database refuses writes while the spool still has room, so
	// that the collector acknowledges records meanwhile.
	c.setPhase("read-only")
	fmt.Fprintln(os.Stderr, "database read-only for 6 s")
	if err := c.readOnly(ctx); err != nil {
		stopSend()
		<-sendDone
		return err
	}
	if *tmpfsDB {
		c.setPhase("disk full")
		fmt.Fprintln(os.Stderr, "database disk full for 8 s")
		if err := c.diskFull(ctx); err != nil {
			stopSend()
			<-sendDone
			return err
		}
	}
	// The server away long enough for the spool to fill.
	c.setPhase("spool full")
	fmt.Fprintln(os.Stderr, "server down while the spool fills")
	c.server.Process.Kill()
	c.server.Wait()
	sleepCtx(ctx, 8*time.Second)
	if m, err := scrapeCollector(ctx, fmt.Sprintf("127.0.0.1:%d", c.metricsPort)); err == nil {
		c.spoolFull = m
	}
	if err := c.startServer(ctx); err != nil {
		stopSend()
		<-sendDone
		return err
	}
	if *attacks {
		c.setPhase("attacks")
		c.attack(ctx)
	}
	c.setPhase("after")
	sleepCtx(ctx, 2*time.Second)
	stopSend()
	<-sendDone
	return c.report(ctx)
}

func (c *chaos) setPhase(p string) {
	c.mu.Lock()
	c.phase = p
	c.mu.Unlock()
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func freeLoopbackPort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// send posts batches of 10 step records at the rate asked, sending a batch
// again until the collector acknowledges it, as the hook does.
func (c *chaos) send(ctx context.Context) {
	client := &http.Client{Timeout: 10 * time.Second}
	url := fmt.Sprintf("http://127.0.0.1:%d/api/v1/ingest", c.hookPort)
	tick := time.NewTicker(time.Second * 10 / time.Duration(c.rate))
	defer tick.Stop()
	step := int64(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var b strings.Builder
		for i := step; i < step+10; i++ {
			fmt.Fprintf(&b, `{"kind":"step","run_id":%q,"rank":0,"step":%d,"time":%d,"loss":1.5}`+"\n", c.run, i, 1700000000+i)
		}
		for ctx.Err() == nil {
			resp, err := client.Post(url, "application/x-ndjson", strings.NewReader(b.String()))
			c.mu.Lock()
			if err != nil {
				c.unreach[c.phase]++
			} else if resp.StatusCode == http.StatusServiceUnavailable {
				c.deferred[c.phase]++
			}
			c.mu.Unlock()
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					c.mu.Lock()
					for i := step; i < step+10; i++ {
						c.acked[i] = c.phase
					}
					c.mu.Unlock()
					break
				}
			}
			sleepCtx(ctx, 100*time.Millisecond)
		}
		step += 10
	}
}

func (c *chaos) startPostgres(ctx context.Context) error {
	if c.pg == nil {
		c.pg = &localpg.Cluster{Dir: filepath.Join(c.dir, "pg"), Fsync: true}
	}
	var err error
	for try := 0; try < 20; try++ {
		if c.dbURL, err = c.pg.Start(ctx); err == nil {
			return nil
		}
		sleepCtx(ctx, 500*time.Millisecond) // the killed one's backends are still exiting
	}
	return fmt.Errorf("bench chaos: start PostgreSQL: %w", err)
}

func (c *chaos) killPostgres(ctx context.Context) error {
	pid, err := postmasterPID(c.pg.Dir)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill postmaster %d: %w", pid, err)
	}
	for syscall.Kill(pid, 0) == nil {
		sleepCtx(ctx, 50*time.Millisecond)
	}
	sleepCtx(ctx, time.Second)
	_ = c.pg.Stop() // lets go of the cluster's lock; the cluster is dead already
	return c.startPostgres(ctx)
}

func postmasterPID(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("read postmaster.pid: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

func (c *chaos) start(ctx context.Context, name string, env []string, args ...string) (*exec.Cmd, error) {
	cmd := exec.Command(c.bin, args...)
	cmd.Env = append(os.Environ(), env...)
	buf := c.logs[name]
	if buf == nil {
		buf = &bytes.Buffer{}
		c.logs[name] = buf
	}
	cmd.Stdout, cmd.Stderr = buf, buf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return cmd, nil
}

func (c *chaos) startServer(ctx context.Context) error {
	cmd, err := c.start(ctx, "server", []string{"DEEPSEED_INGEST_TOKENS=" + c.token, "DEEPSEED_READ_TOKENS=" + c.token},
		"serve", "--listen", fmt.Sprintf("127.0.0.1:%d", c.serverPort), "--database-url", c.dbURL, "--log-level", "warn",
		"--body-timeout", chaosBodyTimeout.String())
	if err != nil {
		return err
	}
	c.server = cmd
	return waitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", c.serverPort), 200)
}

func (c *chaos) killServer(ctx context.Context) error {
	c.server.Process.Kill()
	c.server.Wait()
	sleepCtx(ctx, time.Second)
	return c.startServer(ctx)
}

func (c *chaos) startCollector(ctx context.Context) error {
	cmd, err := c.start(ctx, "collector", []string{"DEEPSEED_TOKEN=" + c.token},
		"collect", "--server", fmt.Sprintf("http://127.0.0.1:%d", c.serverPort), "--hook-listen", fmt.Sprintf("127.0.0.1:%d", c.hookPort),
		// Host samples every 50 ms: the collector's own records compete for
		// the spool with the hook's when it fills.
		"--metrics-listen", fmt.Sprintf("127.0.0.1:%d", c.metricsPort), "--no-gpu", "--interval", "50ms", "--batch-max-age", "100ms",
		"--spool-dir", filepath.Join(c.dir, "spool"), "--spool-max-bytes", strconv.FormatInt(c.spoolMax, 10), "--log-level", "warn",
		"--body-timeout", chaosBodyTimeout.String())
	if err != nil {
		return err
	}
	c.collect = cmd
	return waitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/api/v1/ingest", c.hookPort), 0)
}

func (c *chaos) killCollector(ctx context.Context) error {
	c.collect.Process.Kill()
	c.collect.Wait()
	sleepCtx(ctx, 300*time.Millisecond)
	return c.startCollector(ctx)
}

// waitReady polls url until it answers want (any answer when want is 0).
func waitReady(ctx context.Context, url string, want int) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if want == 0 || resp.StatusCode == want {
				return nil
			}
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
	return fmt.Errorf("%s did not answer in time", url)
}

func (c *chaos) stopAll() {
	for _, cmd := range []*exec.Cmd{c.collect, c.server} {
		if cmd != nil && cmd.Process != nil {
			cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
			}
		}
	}
	if c.pg != nil {
		_ = c.pg.Stop()
	}
}

// report waits for the acknowledged records to arrive (bounded), then
// counts lost and duplicated ones per phase.
func (c *chaos) report(ctx context.Context) error {
	st, err := store.Open(ctx, c.dbURL, nil)
	if err != nil {
		return fmt.Errorf("bench chaos: %w", err)
	}
	defer st.Close()
	c.mu.Lock()
	acked := make(map[int64]string, len(c.acked))
	for k, v := range c.acked {
		acked[k] = v
	}
	c.mu.Unlock()
	stored := map[int64]int{}
	deadline := time.Now().Add(90 * time.Second)
	for {
		if got, err := st.StepCopies(ctx, c.run); err == nil {
			stored = got
		} else {
			stored = map[int64]int{}
		}
		missing := 0
		for s := range acked {
			if stored[s] == 0 {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			break
		}
		sleepCtx(ctx, 500*time.Millisecond)
	}
	type row struct{ acked, lost, dup int }
	byPhase := map[string]*row{}
	var phases []string
	for s, p := range acked {
		r := byPhase[p]
		if r == nil {
			r = &row{}
			byPhase[p] = r
			phases = append(phases, p)
		}
		r.acked++
		if stored[s] == 0 {
			r.lost++
		}
		if stored[s] > 1 {
			r.dup++
		}
	}
	// A phase whose posts were all deferred has a row too.
	c.mu.Lock()
	for _, m := range []map[string]int{c.deferred, c.unreach} {
		for p := range m {
			if byPhase[p] == nil {
				byPhase[p] = &row{}
				phases = append(phases, p)
			}
		}
	}
	c.mu.Unlock()
	order := map[string]int{"postgres": 0, "server": 1, "collector": 2, "read-only": 3, "disk full": 4, "spool full": 5, "attacks": 6, "after": 7}
	sort.Slice(phases, func(i, j int) bool { return order[phases[i]] < order[phases[j]] })
	fmt.Printf("%-12s %10s %8s %12s %10s %12s\n", "fault", "acked", "lost", "duplicated", "503s", "unanswered")
	total := row{}
	for _, p := range phases {
		r := byPhase[p]
		c.mu.Lock()
		fmt.Printf("%-12s %10d %8d %12d %10d %12d\n", p, r.acked, r.lost, r.dup, c.deferred[p], c.unreach[p])
		c.mu.Unlock()
		total.acked += r.acked
		total.lost += r.lost
		total.dup += r.dup
	}
	fmt.Printf("%-12s %10d %8d %12d\n", "total", total.acked, total.lost, total.dup)
	fmt.Printf("(503s: posts the collector deferred, its spool full; unanswered: posts while it was down. Both are sent again, as the hook does.)\n")
	if m := c.spoolFull; m != nil {
		fmt.Printf("spool full, before the server came back: %.0f acknowledged hook records and %.0f sampled ones spooled, %.0f sampled records dropped to make room, %.0f hook requests answered 503\n",
			m[`deepseed_collector_spool_records{source="hook"}`], m[`deepseed_collector_spool_records{source="sampled"}`],
			m[`deepseed_collector_records_dropped_total{reason="spool_full"}`], m["deepseed_collector_hook_requests_deferred_total"])
	}
	dead := deadLettered(filepath.Join(c.dir, "spool"))
	// The server logs every 5xx but 503 at ERROR with its status.
	n500 := 0
	if b := c.logs["server"]; b != nil {
		n500 = strings.Count(b.String(), "status=500")
	}
	fmt.Printf("dead-lettered records: %d; server answers 500: %d; /readyz 503 while the database was read-only: %v\n", dead, n500, c.readOnly503)
	var problems []string
	if n500 > 0 {
		problems = append(problems, fmt.Sprintf("the server answered 500 %d times", n500))
	}
	if total.lost > 0 || total.dup > 0 {
		problems = append(problems, fmt.Sprintf("%d acknowledged records lost, %d duplicated", total.lost, total.dup))
	}
	if dead > 0 {
		problems = append(problems, fmt.Sprintf("%d records dead-lettered", dead))
	}
	if !c.readOnly503 {
		problems = append(problems, "/readyz never answered 503 while the database refused writes")
	}
	if c.dbMount != "" {
		fmt.Printf("/readyz 503 while the database's disk was full: %v\n", c.diskFull503)
		if !c.diskFull503 {
			problems = append(problems, "/readyz never answered 503 while the database's disk was full")
		}
	}
	if len(c.attacks) > 0 {
		fmt.Println()
		printAttacks(os.Stdout, c.attacks)
		fmt.Printf("(rss: before the attack; peak: the most sampled from /proc during it; probes: another client's posts meanwhile, p50 and max of their answer times)\n")
		problems = append(problems, c.attackProblems()...)
	}
	if len(problems) > 0 {
		for name, b := range c.logs {
			fmt.Fprintf(os.Stderr, "--- %s log (last lines)\n%s\n", name, lastLinesOf(b.String(), 20))
		}
		return fmt.Errorf("bench chaos: %s", strings.Join(problems, "; "))
	}
	return nil
}

func lastLinesOf(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
