package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/store/storetest"
)

// A migrate on the data directory of a running serve connects to that
// server's private PostgreSQL as a client and leaves it running: the
// server stays ready after migrate exits.
func TestMigrateBesideServeLeavesClusterRunning(t *testing.T) {
	dataDir := storetest.DataDir(t)
	pgPort, httpPort := freePort(t), freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	cmd, exited, _ := startServe(t, []string{"DEEPSEED_DATA_DIR=" + dataDir},
		"--listen", fmt.Sprintf("127.0.0.1:%d", httpPort), "--local-pg-port", itoa(pgPort))
	waitHTTP(t, base+"/readyz", 200, exited)

	// Another port than the server's: migrate must use the running
	// cluster's, not start a second one.
	code, out, stderr := runBinary(t, nil, "migrate", "--data-dir", dataDir, "--local-pg-port", itoa(freePort(t)))
	if code != 0 {
		t.Fatalf("migrate beside serve: exit %d: %s", code, stderr)
	}
	if !strings.Contains(out, "applied 0 migration") {
		t.Errorf("migrate beside serve printed %q, want nothing left to apply", out)
	}
	if !strings.Contains(stderr, "connecting to it as a client") {
		t.Errorf("migrate did not say it used the running cluster as a client:\n%s", stderr)
	}
	for i := range 3 {
		res, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatalf("readyz after migrate (%d): %v", i, err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("readyz after migrate (%d) = %d, want 200", i, res.StatusCode)
		}
	}
	// A second serve on the same directory is a client too; its exit
	// leaves the first one's cluster up.
	otherHTTP := freePort(t)
	other, otherExited, _ := startServe(t, []string{"DEEPSEED_DATA_DIR=" + dataDir},
		"--listen", fmt.Sprintf("127.0.0.1:%d", otherHTTP), "--local-pg-port", itoa(pgPort))
	waitHTTP(t, fmt.Sprintf("http://127.0.0.1:%d/readyz", otherHTTP), 200, otherExited)
	stopServe(t, other, otherExited)
	waitHTTP(t, base+"/readyz", 200, exited)

	// The owner stops its cluster when it exits.
	stopServe(t, cmd, exited)
	ctx := context.Background()
	if c, err := pgx.Connect(ctx, privateURL(t, dataDir, pgPort, "postgres")+"&connect_timeout=2"); err == nil {
		c.Close(ctx)
		t.Fatal("private PostgreSQL still answers after its owner exited")
	}
}

// The lock of an owner killed with SIGKILL is taken over by the next
// serve, which adopts the cluster left running and stops it at exit.
func TestServeTakesOverKilledOwner(t *testing.T) {
	dataDir := storetest.DataDir(t)
	pgPort, httpPort := freePort(t), freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	args := []string{"--listen", fmt.Sprintf("127.0.0.1:%d", httpPort), "--local-pg-port", itoa(pgPort)}
	env := []string{"DEEPSEED_DATA_DIR=" + dataDir}

	cmd, exited, _ := startServe(t, env, args...)
	waitHTTP(t, base+"/readyz", 200, exited)
	lock, err := os.ReadFile(filepath.Join(dataDir, "postgres.owner"))
	if err != nil || !strings.Contains(string(lock), fmt.Sprintf("pid=%d\n", cmd.Process.Pid)) {
		t.Fatalf("owner lock = %q, %v; want it to name pid %d", lock, err, cmd.Process.Pid)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited.done

	cmd, exited, logs := startServe(t, env, args...)
	waitHTTP(t, base+"/readyz", 200, exited)
	if !strings.Contains(logs.String(), "adopting the private PostgreSQL") {
		t.Errorf("second serve did not adopt the cluster left running:\n%s", logs)
	}
	lock, _ = os.ReadFile(filepath.Join(dataDir, "postgres.owner"))
	if !strings.Contains(string(lock), fmt.Sprintf("pid=%d\n", cmd.Process.Pid)) {
		t.Errorf("owner lock after takeover = %q, want pid %d", lock, cmd.Process.Pid)
	}
	stopServe(t, cmd, exited)
	ctx := context.Background()
	if c, err := pgx.Connect(ctx, privateURL(t, dataDir, pgPort, "postgres")+"&connect_timeout=2"); err == nil {
		c.Close(ctx)
		t.Fatal("adopted PostgreSQL still answers after the new owner exited")
	}
}
