package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/internal/localpg"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

func TestVersion(t *testing.T) {
	code, out, _ := runBinary(t, nil, "version")
	if code != 0 || strings.TrimSpace(out) != "deepseed "+testVersion {
		t.Fatalf("deepseed version: exit %d, %q", code, out)
	}
}

// Every flag's environment variable, and the token variables, are in the
// help; "deepseed help CMD" and "deepseed CMD -h" say the same.
func TestHelpNamesEveryEnvVar(t *testing.T) {
	code, stdout, _ := runBinary(t, nil, "help")
	if code != 0 {
		t.Fatalf("deepseed help: exit %d", code)
	}
	for _, c := range commands {
		if !strings.Contains(stdout, c.name) {
			t.Errorf("deepseed help does not list %s", c.name)
		}
	}
	dbVars := []string{"DEEPSEED_DATABASE_URL", "DEEPSEED_DATA_DIR", "DEEPSEED_LOCAL_PG_PORT", "DEEPSEED_TIMESCALE",
		"DEEPSEED_COMPRESS_AFTER", "DEEPSEED_LOG_LEVEL", "DEEPSEED_LOG_FORMAT"}
	want := map[string][]string{
		"serve": append([]string{"DEEPSEED_LISTEN", "DEEPSEED_ROLE", "DEEPSEED_MAX_BODY_BYTES", "DEEPSEED_STRAGGLER_PCT",
			"DEEPSEED_SHUTDOWN_TIMEOUT", "DEEPSEED_RETENTION", "DEEPSEED_INGEST_TOKENS", "DEEPSEED_READ_TOKENS", "/readyz", "/metrics"}, dbVars...),
		"migrate": dbVars,
	}
	for cmd, vars := range want {
		_, viaFlag, _ := runBinary(t, nil, cmd, "-h")
		_, viaHelp, _ := runBinary(t, nil, "help", cmd)
		if viaFlag != viaHelp {
			t.Errorf("deepseed %s -h and deepseed help %s differ", cmd, cmd)
		}
		for _, v := range vars {
			if !strings.Contains(viaFlag, v) {
				t.Errorf("deepseed %s -h does not mention %s", cmd, v)
			}
		}
	}
}

// Bad configuration is refused before anything starts, naming each field.
func TestServeRejectsBadConfig(t *testing.T) {
	code, _, stderr := runBinary(t, []string{"DEEPSEED_LOG_FORMAT=xml"}, "serve", "--role", "both", "--retention", "forever", "--listen", "nowhere")
	if code == 0 {
		t.Fatal("deepseed serve with bad flags exited 0")
	}
	for _, field := range []string{"--role", "--retention", "--log-format", "--listen"} {
		if !strings.Contains(stderr, field) {
			t.Errorf("error does not name %s:\n%s", field, stderr)
		}
	}
}

func TestMigrate(t *testing.T) {
	admin := storetest.AdminURL(t)
	ctx := context.Background()
	name := fmt.Sprintf("deepseed_migrate_%d", time.Now().UnixNano())
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE DATABASE `+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`) })
	url := storetest.WithDatabase(admin, name)

	for i := range 2 {
		code, out, stderr := runBinary(t, nil, "migrate", "--database-url", url)
		if code != 0 {
			t.Fatalf("migrate run %d: exit %d: %s", i, code, stderr)
		}
		ms, _ := store.Migrations()
		wantApplied := len(ms)
		if i == 1 {
			wantApplied = 0 // nothing left to do the second time
		}
		if !strings.Contains(out, fmt.Sprintf("applied %d migration", wantApplied)) {
			t.Errorf("migrate run %d printed %q, want %d applied", i, out, wantApplied)
		}
	}
	st, err := store.Open(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if ok, err := st.Migrated(ctx); err != nil || !ok {
		t.Fatalf("after deepseed migrate: Migrated = %v, %v", ok, err)
	}
}

// startServe starts "deepseed serve" and returns a channel that receives
// its exit once it ends.
func startServe(t *testing.T, env []string, args ...string) (*exec.Cmd, *exit, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(binary(t), append([]string{"serve"}, args...)...)
	cmd.Env = append(cleanEnv(), env...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := &exit{done: make(chan struct{})}
	go func() {
		exited.err = cmd.Wait()
		close(exited.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited.done:
		case <-time.After(90 * time.Second):
			_ = cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("deepseed serve output:\n%s", logs.String())
		}
	})
	return cmd, exited, &logs
}

// stopServe sends SIGTERM and checks for exit status 0.
func stopServe(t *testing.T, cmd *exec.Cmd, exited *exit) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited.done:
		if exited.err != nil {
			t.Fatalf("deepseed serve after SIGTERM: %v, want exit 0", exited.err)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("deepseed serve did not exit after SIGTERM")
	}
}

// With no database URL, serve starts a private PostgreSQL in --data-dir,
// keeps its data across a restart and stops it on exit.
func TestServePrivatePostgresKeepsData(t *testing.T) {
	dataDir := storetest.DataDir(t)
	pgPort, httpPort := freePort(t), freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	args := []string{"--listen", fmt.Sprintf("127.0.0.1:%d", httpPort), "--local-pg-port", itoa(pgPort)}
	env := []string{"DEEPSEED_DATA_DIR=" + dataDir}
	ctx := context.Background()

	cmd, exited, logs := startServe(t, env, args...)
	waitHTTP(t, base+"/readyz", 200, exited)
	dbURL := privateURL(t, dataDir, pgPort, "deepseed")
	// Ready comes with the migrations; the mode (TimescaleDB setup can
	// take a few seconds) is logged and shown by /readyz once known.
	if mode := waitMode(t, base, exited); !strings.Contains(logs.String(), "database mode:") {
		t.Errorf("serve reports mode %q but did not log it:\n%s", mode, logs)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO runs (run_id, name) VALUES ('kept-run', 'survives restarts')`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	stopServe(t, cmd, exited)
	// The private cluster stopped with the server.
	if c, err := pgx.Connect(ctx, dbURL+"&connect_timeout=2"); err == nil {
		c.Close(ctx)
		t.Fatal("private PostgreSQL still answers after deepseed serve exited")
	}

	cmd, exited, _ = startServe(t, env, args...)
	waitHTTP(t, base+"/readyz", 200, exited)
	conn, err = pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	var name string
	err = conn.QueryRow(ctx, `SELECT name FROM runs WHERE run_id = 'kept-run'`).Scan(&name)
	conn.Close(ctx)
	if err != nil || name != "survives restarts" {
		t.Fatalf("after restart: run name %q, %v", name, err)
	}
	stopServe(t, cmd, exited)
}

// Against a given database, SIGTERM ends serve with exit status 0.
func TestServeSIGTERMExitsZero(t *testing.T) {
	url := storetest.NewDatabase(t)
	httpPort := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	cmd, exited, logs := startServe(t, []string{"DEEPSEED_DATABASE_URL=" + url, "DEEPSEED_INGEST_TOKENS=ingest-secret-123"},
		"--listen", fmt.Sprintf("127.0.0.1:%d", httpPort))
	waitHTTP(t, base+"/readyz", 200, exited)
	waitHTTP(t, base+"/api/v1/runs", 401, exited)
	stopServe(t, cmd, exited)
	if strings.Contains(logs.String(), "ingest-secret-123") {
		t.Fatal("a token appeared in the log")
	}
}

// privateURL is the URL of database db on the private PostgreSQL that
// serve keeps in dataDir, with the password it generated.
func privateURL(t *testing.T, dataDir string, port int, db string) string {
	t.Helper()
	pw, err := localpg.ReadPassword(filepath.Join(dataDir, "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/%s?sslmode=disable", pw, port, db)
}
