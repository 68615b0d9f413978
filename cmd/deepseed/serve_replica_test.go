package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store/storetest"
)

// --read-database-url fits only a query-serving server beside a primary
// URL, and is refused otherwise, by name.
func TestServeReadDatabaseURLNeedsAPrimaryAndAQueryRole(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--read-database-url", "postgres://u@standby/deepseed"},
		{"serve", "--role", "ingest", "--database-url", "postgres://u@primary/deepseed", "--read-database-url", "postgres://u@standby/deepseed"},
		{"serve", "--database-url", "postgres://u@primary/deepseed", "--read-database-url", "postgres://u@standby:port/deepseed"},
	} {
		code, _, stderr := runBinary(t, nil, args...)
		if code != 1 || !strings.Contains(stderr, "invalid --read-database-url") || strings.Contains(stderr, "standby/deepseed") {
			t.Errorf("%v: exit %d, stderr %q; want exit 1 naming --read-database-url without its value", args, code, stderr)
		}
	}
}

// serve --role query reads from a standby given as --read-database-url
// and says so in /readyz; serve with a standby as --database-url stops
// at start, saying what to give instead.
func TestServeQueryOnStandby(t *testing.T) {
	pair := storetest.NewReplicated(t)
	port := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	cmd, exited, logs := startServe(t, []string{"DEEPSEED_DATABASE_URL=" + pair.PrimaryURL, "DEEPSEED_READ_DATABASE_URL=" + pair.StandbyURL},
		"--role", "query", "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	waitHTTP(t, base+"/readyz", http.StatusOK, exited)
	res, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var rd struct {
		Ready        bool `json:"ready"`
		ReadDatabase *struct {
			Standby bool `json:"standby"`
		} `json:"read_database"`
	}
	if err := json.Unmarshal(body, &rd); err != nil || !rd.Ready || rd.ReadDatabase == nil || !rd.ReadDatabase.Standby {
		t.Fatalf("readyz of a query server on a standby: %s (%v)", body, err)
	}
	stopServe(t, cmd, exited)
	if out := logs.String(); strings.Contains(out, "level=ERROR") {
		t.Errorf("errors logged:\n%s", out)
	}

	_, exited, logs = startServe(t, []string{"DEEPSEED_DATABASE_URL=" + pair.StandbyURL}, "--role", "query", "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	select {
	case <-exited.done:
	case <-time.After(90 * time.Second):
		t.Fatalf("serve with a standby as its database still runs after 90s:\n%s", logs)
	}
	if last := lastLine(logs.String()); exited.err == nil || !strings.HasPrefix(last, "deepseed: database: ") ||
		!strings.Contains(last, "hot standby") || !strings.Contains(last, "--read-database-url") {
		t.Fatalf("serve with a standby as its database: %v, last line %q; want exit 1 naming the standby and --read-database-url", exited.err, last)
	}
}
