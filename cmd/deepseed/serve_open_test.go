package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store/storetest"
)

// With no token configured, serve keeps the API to this machine: its
// default address is loopback, another address is refused at start
// unless --insecure-open (or its variable) says so, and then the start
// says loudly that the API is open.
func TestServeWithoutTokensStaysOnLoopback(t *testing.T) {
	port := freePort(t)
	code, _, stderr := runBinary(t, nil, "serve", "--listen", fmt.Sprintf("0.0.0.0:%d", port))
	if code == 0 || !strings.Contains(stderr, "--listen") || !strings.Contains(stderr, "--insecure-open") ||
		!strings.Contains(stderr, "DEEPSEED_INGEST_TOKENS") {
		t.Fatalf("serve --listen 0.0.0.0 without tokens: exit %d, stderr:\n%s\nwant a refusal naming the token variables and --insecure-open", code, stderr)
	}
	if _, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", port)); err == nil {
		t.Fatal("something answers on the refused address")
	}

	db := []string{"DEEPSEED_DATABASE_URL=" + storetest.NewDatabase(t)}
	// No --listen: loopback, port 8080. Another process may hold that port
	// on a shared machine; either way serve names the address it took.
	cmd, exited, logs := startServe(t, db)
	if waitLog(t, logs, exited, "msg=listening addr=127.0.0.1:8080") {
		stopServe(t, cmd, exited)
	} else if !strings.Contains(logs.String(), "listen on 127.0.0.1:8080") {
		t.Fatalf("serve with no --listen and no tokens did not take 127.0.0.1:8080:\n%s", logs)
	}
	if strings.Contains(logs.String(), "INSECURE") {
		t.Errorf("a loopback server logged itself insecure:\n%s", logs)
	}

	for _, how := range [][]string{{"--insecure-open"}, nil} {
		port := freePort(t)
		env := db
		if how == nil {
			env = append(env[:len(env):len(env)], "DEEPSEED_INSECURE_OPEN=1")
		}
		cmd, exited, logs := startServe(t, env, append([]string{"--listen", fmt.Sprintf("0.0.0.0:%d", port)}, how...)...)
		waitHTTP(t, fmt.Sprintf("http://127.0.0.1:%d/healthz", port), 200, exited)
		if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "INSECURE") {
			t.Errorf("open on the network (%v) without a loud error:\n%s", how, logs)
		}
		stopServe(t, cmd, exited)
	}

	// With a token, every interface is the default and needs no flag.
	port = freePort(t)
	cmd, exited, logs = startServe(t, append(db[:1:1], "DEEPSEED_READ_TOKENS=r", "DEEPSEED_INGEST_TOKENS=i"),
		"--listen", fmt.Sprintf(":%d", port))
	waitHTTP(t, fmt.Sprintf("http://127.0.0.1:%d/healthz", port), 200, exited)
	if strings.Contains(logs.String(), "INSECURE") {
		t.Errorf("a server with tokens logged itself insecure:\n%s", logs)
	}
	stopServe(t, cmd, exited)
}

// waitLog waits until the output of a serve holds s (true), or it exits
// (false).
func waitLog(t *testing.T, logs interface{ String() string }, exited *exit, s string) bool {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if strings.Contains(logs.String(), s) {
			return true
		}
		select {
		case <-exited.done:
			return strings.Contains(logs.String(), s)
		default:
		}
	}
	t.Fatalf("serve never named %s:\n%s", s, logs.String())
	return false
}
