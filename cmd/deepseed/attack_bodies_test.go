package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/store/storetest"
)

// The attacks of valid bodies sent in full, against a real server and a
// real collector with their default bounds, for the figures of
// docs/durability.md: resident memory is measured, not asserted, as a
// loaded machine makes it vary. It runs for minutes, so only when
// DEEPSEED_ATTACK_BODIES is set; DEEPSEED_TEST_BINARY runs another build
// (an older one, for the figures before).
func TestAttackBodiesFigures(t *testing.T) {
	if os.Getenv("DEEPSEED_ATTACK_BODIES") == "" {
		t.Skip("set DEEPSEED_ATTACK_BODIES=1 to measure (minutes)")
	}
	dbURL := storetest.NewDatabase(t)
	port := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	serve, exited, _ := startServe(t, []string{"DEEPSEED_INGEST_TOKENS=attack-token"},
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--database-url", dbURL, "--alerts-every", "off", "--log-level", "warn")
	waitHTTP(t, base+"/readyz", 200, exited)
	hookPort := freePort(t)
	col := startCollect(t, base, t.TempDir(), hookPort, "--log-level", "warn")
	step := 0
	probe := func(url, token string) func() *http.Request {
		return func() *http.Request {
			step++
			body := fmt.Sprintf(`{"kind":"step","run_id":"attack-probe","rank":0,"step":%d,"time":%d,"loss":1}`, step, 1700000000+step)
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			return req
		}
	}
	var all []*attackResult
	for _, target := range []attackTarget{
		{name: "server", addr: fmt.Sprintf("127.0.0.1:%d", port), token: "attack-token", pid: serve.Process.Pid,
			probe: probe(base+"/api/v1/ingest", "attack-token")},
		{name: "collector", addr: fmt.Sprintf("127.0.0.1:%d", hookPort), pid: col.cmd.Process.Pid, probe: probe(col.hook, "")},
	} {
		all = append(all, attackBodies(context.Background(), target, "attack")...)
	}
	for _, r := range all {
		for status, n := range r.statuses {
			if status >= 500 && status != http.StatusServiceUnavailable {
				t.Errorf("%s under %s: %d answers %d", r.target, r.attack, n, status)
			}
		}
	}
	var b strings.Builder
	printAttacks(&b, all)
	t.Logf("\n%s", b.String())
}
