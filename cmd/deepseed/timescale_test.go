package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/internal/localpg"
	"github.com/deepseed/deepseed/store/storetest"
)

// serve and migrate agree on a database where TimescaleDB is not usable
// (here a cluster started without preloading it, or a machine without
// it): auto runs plain PostgreSQL and says how to enable TimescaleDB,
// --timescale=require makes both fail.
func TestTimescaleRuleSameForServeAndMigrate(t *testing.T) {
	lp := &localpg.Cluster{Dir: filepath.Join(storetest.DataDir(t), "pg"), WithoutTimescale: true}
	if _, err := lp.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lp.Stop() })
	url := lp.URL("postgres")

	code, out, stderr := runBinary(t, nil, "migrate", "--database-url", url)
	if code != 0 || !strings.Contains(out, "database mode: plain PostgreSQL") || !strings.Contains(stderr, "shared_preload_libraries") {
		t.Fatalf("migrate (auto): exit %d, stdout %q, stderr:\n%s\nwant exit 0, plain mode and how to enable TimescaleDB", code, out, stderr)
	}
	code, _, stderr = runBinary(t, nil, "migrate", "--database-url", url, "--timescale", "require")
	if code == 0 || !strings.Contains(stderr, "TimescaleDB required") {
		t.Fatalf("migrate --timescale=require: exit %d, stderr:\n%s\nwant a failure naming the requirement", code, stderr)
	}

	httpPort := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	cmd, exited, logs := startServe(t, []string{"DEEPSEED_DATABASE_URL=" + url}, "--listen", fmt.Sprintf("127.0.0.1:%d", httpPort))
	waitHTTP(t, base+"/readyz", 200, exited)
	if mode := waitMode(t, base, exited); mode != "postgresql" {
		t.Fatalf("serve (auto) mode %q, want postgresql", mode)
	}
	stopServe(t, cmd, exited)
	if !strings.Contains(logs.String(), "shared_preload_libraries") {
		t.Errorf("serve (auto) did not say how to enable TimescaleDB:\n%s", logs)
	}
	// Plain mode where TimescaleDB is not usable is a normal start: said
	// once, at INFO, not as a failed setup.
	if out := logs.String(); strings.Count(out, "database mode:") != 1 || !strings.Contains(out, `level=INFO msg="database mode: plain PostgreSQL`) ||
		strings.Contains(out, "setup failed") || strings.Contains(out, "level=WARN msg=\"database") {
		t.Errorf("serve (auto) on a database without a usable TimescaleDB: want one INFO line naming the mode:\n%s", out)
	}

	cmd, exited, logs = startServe(t, []string{"DEEPSEED_DATABASE_URL=" + url, "DEEPSEED_TIMESCALE=require"},
		"--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	_ = cmd
	<-exited.done
	if exited.err == nil || !strings.Contains(logs.String(), "TimescaleDB required") {
		t.Fatalf("serve --timescale=require: %v, output:\n%s\nwant a failing exit naming the requirement", exited.err, logs)
	}
}
