package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/server"
	"github.com/deepseed/deepseed/server/servertest"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// A database that refuses writes for a while (read-only, or its disk
// full) costs nothing acknowledged: the server answers 503 with
// Retry-After, never 500, and turns not ready; the collector keeps the
// batches and sends them again; once the database takes writes every
// acknowledged record arrives, none in the dead-letter file, and the
// server is ready again.
func TestTransientWriteFailuresKeepEveryRecord(t *testing.T) {
	t.Run("read-only", func(t *testing.T) {
		dbURL := storetest.NewDatabase(t)
		name := dbName(t, dbURL)
		admin := storetest.AdminURL(t)
		transientOutage(t, dbURL,
			func() {
				adminExec(t, admin, fmt.Sprintf(`ALTER DATABASE %s SET default_transaction_read_only = on`, name))
				dropSessions(t, admin, name)
			},
			func() {
				adminExec(t, admin, fmt.Sprintf(`ALTER DATABASE %s RESET default_transaction_read_only`, name))
				dropSessions(t, admin, name)
			})
	})
	t.Run("disk full", func(t *testing.T) {
		admin := storetest.AdminURL(t)
		dir := smallDisk(t, admin)
		ts := "deepseed_small_" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "_"))[:10] + fmt.Sprint(os.Getpid())
		adminExec(t, admin, fmt.Sprintf(`CREATE TABLESPACE %s OWNER CURRENT_USER LOCATION '%s'`, ts, dir))
		t.Cleanup(func() { _ = execAdmin(admin, `DROP TABLESPACE IF EXISTS `+ts) })
		dbURL := storetest.NewDatabaseIn(t, ts)
		filler := filepath.Join(dir, "filler")
		transientOutage(t, dbURL,
			func() {
				// Fill the file system to its last byte, as the server's
				// own files would.
				f, err := os.Create(filler)
				if err != nil {
					t.Fatal(err)
				}
				chunk := make([]byte, 64<<10)
				for {
					if _, err := f.Write(chunk); err != nil {
						break
					}
				}
				for {
					if _, err := f.Write(chunk[:512]); err != nil {
						break
					}
				}
				f.Close()
			},
			func() {
				if err := os.Remove(filler); err != nil {
					t.Fatal(err)
				}
			})
	})
}

// transientOutage runs a server on dbURL and a collector process before
// it, breaks the database's writes with breakWrites, posts records through
// the collector meanwhile, then mends it and checks what arrived.
func transientOutage(t *testing.T, dbURL string, breakWrites, mend func()) {
	st, err := store.Open(context.Background(), dbURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	cfg := server.DefaultConfig()
	cfg.IngestTokens = []string{"collect-token"}
	base := servertest.Start(t, cfg, st)
	spool := t.TempDir()
	col := startCollect(t, base, spool, freePort(t))
	run := "transient-" + strings.ReplaceAll(t.Name(), "/", "-")

	acked := 0
	postAll := func(from, to, per int) {
		for s := from; s < to; s += per {
			for {
				code, _, err := col.post(run, 0, s, s+per)
				if err == nil && code == 200 {
					acked += per
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	postAll(0, 100, 50)
	waitSteps(t, st, run, acked)

	breakWrites()
	// Large batches, so that the tables must grow.
	postAll(100, 2100, 500)

	// The server itself answers a write 503 with Retry-After, never 500,
	// and says it is not ready.
	direct := func() (int, string) {
		body := fmt.Sprintf(`{"kind":"step","run_id":%q,"rank":1,"step":1,"time":1700000000,"loss":1}`, run)
		req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/ingest", strings.NewReader(strings.Repeat(body+"\n", 1)))
		req.Header.Set("Authorization", "Bearer collect-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	code, retry := direct()
	for i := 0; code == 200 && i < 100; i++ {
		// Rows that fit in pages the table already has need no space:
		// the next batch that needs some fails.
		postAll(2100+i*500, 2600+i*500, 500)
		code, retry = direct()
	}
	if code != http.StatusServiceUnavailable || retry == "" {
		t.Fatalf("a write while the database refuses writes: %d (Retry-After %q), want 503 with Retry-After", code, retry)
	}
	if code, why := readyz(t, base); code != http.StatusServiceUnavailable || why != "database refuses writes" {
		t.Fatalf("/readyz while writes fail: %d %q, want 503 database refuses writes", code, why)
	}
	// Acknowledged while the writes fail: kept by the collector.
	postAll(100000, 100200, 100)

	mend()
	st.ResetConnections() // the test's own sessions may have been ended too
	want := acked
	waitSteps(t, st, run, want)
	got, twice := stepsOf(t, st, run)
	if len(got) != want || twice != 0 {
		t.Fatalf("%d of %d acknowledged steps stored, %d twice", len(got), want, twice)
	}
	if code, _ := direct(); code != 200 {
		t.Fatalf("a write after the database recovered: %d", code)
	}
	if code, why := readyz(t, base); code != 200 {
		t.Fatalf("/readyz after recovery: %d %q", code, why)
	}
	if b, err := os.ReadFile(filepath.Join(spool, "dead-letter.ndjson")); err == nil && len(b) > 0 {
		t.Fatalf("records dead-lettered while the database only refused writes for a while:\n%.2000s", b)
	}
	if strings.Contains(col.logs.String(), "dead-letter") {
		t.Fatalf("the collector dead-lettered records:\n%s", col.logs.String())
	}
}

func readyz(t *testing.T, base string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r server.Readiness
	_ = json.NewDecoder(resp.Body).Decode(&r)
	return resp.StatusCode, r.Error
}

func dbName(t *testing.T, u string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Database
}

func execAdmin(admin, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

func adminExec(t *testing.T, admin, sql string) {
	t.Helper()
	if err := execAdmin(admin, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// dropSessions ends the sessions on database name, so that the next ones
// start with its new settings.
func dropSessions(t *testing.T, admin, name string) {
	t.Helper()
	adminExec(t, admin, fmt.Sprintf(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '%s' AND pid <> pg_backend_pid()`, name))
}

// smallDisk mounts a 24 MiB tmpfs owned by the PostgreSQL server's user
// and returns its path; it skips the test, saying why, where that cannot
// be done (not root, no mount permitted, a database server elsewhere).
func smallDisk(t *testing.T, admin string) string {
	t.Helper()
	var dataDir string
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	err = conn.QueryRow(ctx, `SELECT current_setting('data_directory')`).Scan(&dataDir)
	conn.Close(ctx)
	if err != nil {
		t.Skipf("cannot read the database server's data directory (%v): the disk-full case needs a local server", err)
	}
	fi, err := os.Stat(dataDir)
	if err != nil {
		t.Skipf("the database server's data directory %s is not on this machine (%v): the disk-full case needs a local server", dataDir, err)
	}
	uid := int(fi.Sys().(*syscall.Stat_t).Uid)
	gid := int(fi.Sys().(*syscall.Stat_t).Gid)
	dir := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("mounting a small tmpfs is not permitted here (%v: %s): the disk-full case needs root", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	// The server's user must own the tablespace, and reach it: open the
	// directories above it to others.
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	for d := filepath.Dir(dir); d != "/" && d != "."; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			_ = os.Chmod(d, fi.Mode().Perm()|0o001)
		}
	}
	return dir
}
