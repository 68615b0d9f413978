package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/deepseed/deepseed/store/storetest"
)

// serve and migrate say in one line what is wrong with the database or
// the ports, before they set anything up: a host that does not resolve
// (serve would wait for it for ever), a database nothing answers for, a
// --listen port or a private PostgreSQL port another process holds.
func TestDatabaseAndPortErrorsInOneLine(t *testing.T) {
	const password = "p4ssw0rd-in-url"
	dead := fmt.Sprintf("postgres://u:%s@127.0.0.1:%d/db", password, freePort(t))
	code, _, stderr := runBinary(t, nil, "migrate", "--database-url", dead)
	oneLine(t, "migrate against nothing", code, stderr, []string{password}, "migrate: cannot reach the database at 127.0.0.1:", "nothing listens there", "DEEPSEED_DATABASE_URL")

	nosuch := "postgres://u:" + password + "@nosuch.invalid:5432/db"
	for _, cmd := range []string{"migrate", "serve"} {
		code, _, stderr = runBinary(t, nil, cmd, "--database-url", nosuch)
		oneLine(t, cmd+" with a host that does not resolve", code, stderr, []string{password}, cmd+": the database host nosuch.invalid", "does not resolve")
	}

	busy := func() (net.Listener, int) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l, l.Addr().(*net.TCPAddr).Port
	}
	_, port := busy()
	code, _, stderr = runBinary(t, nil, "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--database-url", storetest.NewDatabase(t))
	oneLine(t, "serve on a taken port", code, stderr, nil, "--listen", "is taken by another process")

	_, pgPort := busy()
	dataDir := storetest.DataDir(t)
	code, _, stderr = runBinary(t, nil, "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--data-dir", dataDir, "--local-pg-port", itoa(pgPort))
	last := lastLine(stderr)
	oneLine(t, "serve with a taken private PostgreSQL port", code, last, nil, fmt.Sprintf("port %d", pgPort), "--local-pg-port", "DEEPSEED_LOCAL_PG_PORT")
	if _, err := os.Stat(filepath.Join(dataDir, "postgres", "PG_VERSION")); err == nil {
		t.Errorf("serve initialised a private cluster before finding its port taken")
	}
}
