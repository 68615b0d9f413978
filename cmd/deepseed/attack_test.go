package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store/storetest"
)

// rssBound is what each process may hold under the attacks; before the
// bounds, the collector took 2.1 GB under the gzip bombs and the server
// 1.4 GB under the silent bodies.
const rssBound = 300 << 20

// The server and the collector, each a real process, under the attacks
// of slow and hostile clients: 40 connections announcing 32 MiB bodies
// and sending nothing, 500 trickling bodies, 16 concurrent gzip bombs
// twice. Each stays within the memory bound, keeps answering another
// client, and lets go of every attacker: the slow ones are answered 408
// and disconnected, the bombs 413.
func TestAttacksLeaveMemoryBoundedAndOthersAnswered(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes and opens a thousand connections")
	}
	const bodyTimeout = 2 * time.Second
	dbURL := storetest.NewDatabase(t)
	port := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	serve, exited, _ := startServe(t, []string{"DEEPSEED_INGEST_TOKENS=attack-token", "DEEPSEED_BODY_TIMEOUT=" + bodyTimeout.String()},
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--database-url", dbURL, "--alerts-every", "off", "--log-level", "warn")
	waitHTTP(t, base+"/readyz", 200, exited)
	hookPort := freePort(t)
	col := startCollect(t, base, t.TempDir(), hookPort, "--body-timeout", bodyTimeout.String(), "--log-level", "warn")

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
	targets := []attackTarget{
		{name: "server", addr: fmt.Sprintf("127.0.0.1:%d", port), token: "attack-token", pid: serve.Process.Pid,
			probe: probe(base+"/api/v1/ingest", "attack-token")},
		{name: "collector", addr: fmt.Sprintf("127.0.0.1:%d", hookPort), pid: col.cmd.Process.Pid,
			probe: probe(col.hook, "")},
	}
	bomb := gzipBomb(gzipBombBytes)
	var all []*attackResult
	for _, target := range targets {
		for _, r := range attackAll(context.Background(), target, bodyTimeout, bomb) {
			all = append(all, r)
			if r.peakRSS == 0 || r.peakRSS > rssBound {
				t.Errorf("%s under %s: %d MB resident at most, want under %d MB", r.target, r.attack, r.peakRSS>>20, rssBound>>20)
			}
			if r.probes == 0 || r.probeFailed > 0 {
				t.Errorf("%s under %s: %d of %d requests of another client not answered 200", r.target, r.attack, r.probeFailed, r.probes)
			}
			if r.closed != r.attackers {
				t.Errorf("%s under %s: %d of %d attackers let go (%v)", r.target, r.attack, r.closed, r.attackers, r.statuses)
			}
			var want int
			switch {
			case strings.Contains(r.attack, "bomb"):
				want = http.StatusRequestEntityTooLarge
			default:
				want = http.StatusRequestTimeout
			}
			if r.statuses[want] != r.attackers {
				t.Errorf("%s under %s: answers %v, want %d for each of %d", r.target, r.attack, r.statuses, want, r.attackers)
			}
		}
	}
	var b strings.Builder
	printAttacks(&b, all)
	t.Logf("\n%s", b.String())
}
