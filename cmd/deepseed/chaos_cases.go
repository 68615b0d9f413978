package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/deepseed/deepseed/internal/localpg"
	"github.com/deepseed/deepseed/store"
)

// chaosBodyTimeout is the server's and the collector's --body-timeout in
// the chaos bench: short, so that the slow clients are let go in seconds.
const chaosBodyTimeout = 5 * time.Second

// readOnly makes the database refuse writes for 6 s, as a standby or
// default_transaction_read_only does, and notes whether the server said
// it was not ready meanwhile. The sessions are ended at each change so
// the next ones take the setting.
func (c *chaos) readOnly(ctx context.Context) error {
	set := func(on bool) error {
		if err := store.SetReadOnly(ctx, c.dbURL, on); err != nil {
			return fmt.Errorf("bench chaos: read-only: %w", err)
		}
		return nil
	}
	if err := set(true); err != nil {
		return err
	}
	until := time.Now().Add(6 * time.Second)
	for time.Now().Before(until) && ctx.Err() == nil {
		if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", c.serverPort)); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				c.readOnly503 = true
			}
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
	return set(false)
}

// mountDB mounts a 1 GiB tmpfs for PostgreSQL's data directory.
func (c *chaos) mountDB() error {
	c.dbMount = filepath.Join(c.dir, "db")
	if err := os.MkdirAll(c.dbMount, 0o755); err != nil {
		return fmt.Errorf("bench chaos: %w", err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1g,mode=0755", "tmpfs", c.dbMount).CombinedOutput(); err != nil {
		c.dbMount = ""
		return fmt.Errorf("bench chaos: mount a tmpfs for the database (root needed): %v: %s", err, out)
	}
	c.pg = &localpg.Cluster{Dir: filepath.Join(c.dbMount, "pg"), Fsync: true}
	return nil
}

// diskFull fills the database's file system for 8 s, noting whether the
// server said it was not ready meanwhile, then empties it again and
// starts PostgreSQL again if it stopped (a write-ahead log that cannot
// grow stops it), as its service manager would.
func (c *chaos) diskFull(ctx context.Context) error {
	filler := filepath.Join(c.dbMount, "filler")
	f, err := os.Create(filler)
	if err != nil {
		return fmt.Errorf("bench chaos: disk full: %w", err)
	}
	chunk := make([]byte, 1<<20)
	for size := len(chunk); size >= 512; size /= 2 {
		for {
			if _, err := f.Write(chunk[:size]); err != nil {
				break
			}
		}
	}
	f.Close()
	until := time.Now().Add(8 * time.Second)
	for time.Now().Before(until) && ctx.Err() == nil {
		if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", c.serverPort)); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				c.diskFull503 = true
			}
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
	if err := os.Remove(filler); err != nil {
		return fmt.Errorf("bench chaos: disk full: %w", err)
	}
	if pid, err := postmasterPID(c.pg.Dir); err != nil || syscall.Kill(pid, 0) != nil {
		fmt.Fprintln(os.Stderr, "PostgreSQL stopped on the full disk: starting it again")
		_ = c.pg.Stop()
		return c.startPostgres(ctx)
	}
	return nil
}

// attack runs the attacks on the server, then on the collector.
func (c *chaos) attack(ctx context.Context) {
	fmt.Fprintln(os.Stderr, "attacking the server and the collector")
	probeStep := int64(0)
	probe := func(url, token string) func() *http.Request {
		return func() *http.Request {
			probeStep++
			body := fmt.Sprintf(`{"kind":"step","run_id":"%s-probe","rank":0,"step":%d,"time":%d,"loss":1}`, c.run, probeStep, 1700000000+probeStep)
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			return req
		}
	}
	server := fmt.Sprintf("127.0.0.1:%d", c.serverPort)
	hook := fmt.Sprintf("127.0.0.1:%d", c.hookPort)
	bomb := gzipBomb(gzipBombBytes)
	for _, t := range []attackTarget{
		{name: "server", addr: server, token: c.token, pid: c.server.Process.Pid, probe: probe("http://"+server+"/api/v1/ingest", c.token)},
		{name: "collector", addr: hook, pid: c.collect.Process.Pid, probe: probe("http://"+hook+"/api/v1/ingest", "")},
	} {
		c.attacks = append(c.attacks, attackAll(ctx, t, chaosBodyTimeout, bomb)...)
		c.attacks = append(c.attacks, attackBodies(ctx, t, c.run)...)
	}
}

// attackProblems lists what the attacks broke.
func (c *chaos) attackProblems() []string {
	var out []string
	for _, r := range c.attacks {
		if r.peakRSS > c.maxRSS {
			out = append(out, fmt.Sprintf("%s under %s reached %d MB", r.target, r.attack, r.peakRSS>>20))
		}
		if r.probeFailed > 0 {
			out = append(out, fmt.Sprintf("%s under %s left %d of %d requests of another client unanswered", r.target, r.attack, r.probeFailed, r.probes))
		}
		if r.closed != r.attackers {
			out = append(out, fmt.Sprintf("%s under %s held %d of %d attackers", r.target, r.attack, r.attackers-r.closed, r.attackers))
		}
	}
	return out
}

// deadLettered counts the records in the collector's dead-letter file.
func deadLettered(spool string) int {
	f, err := os.Open(filepath.Join(spool, "dead-letter.ndjson"))
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		if len(strings.TrimSpace(sc.Text())) > 0 {
			n++
		}
	}
	return n
}
