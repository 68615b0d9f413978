package httplimit

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBudgetBoundsBodiesInFlight: the bodies of all requests together
// stay within the process's budget. A body past it waits briefly, then
// gets 503 with Retry-After; a small one is still taken at once; once the
// others are answered the budget is whole again.
func TestBudgetBoundsBodiesInFlight(t *testing.T) {
	const budget = 8 << 20
	hold := make(chan struct{})
	holding := make(chan struct{}, 1)
	var holdOnce sync.Once
	addr := serve(t, Limits{MaxInflightBytes: budget}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, lease, err := ReadBodyLease(r, 32<<20)
		defer lease.Release()
		if err != nil {
			if err.RetryAfter > 0 {
				w.Header().Set("Retry-After", fmt.Sprint(err.RetryAfter))
			}
			http.Error(w, err.Error(), err.Status)
			return
		}
		if r.URL.Query().Has("hold") {
			holding <- struct{}{}
			<-hold
		}
		fmt.Fprint(w, len(body))
	}))
	t.Cleanup(func() { holdOnce.Do(func() { close(hold) }) })
	big := bytes.Repeat([]byte("x"), 2<<20) // leased with what it decodes to: 6 MiB
	done := make(chan int)
	go func() {
		resp, err := http.Post("http://"+addr+"/?hold", "text/plain", bytes.NewReader(big))
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	select {
	case <-holding:
	case <-time.After(time.Minute):
		t.Fatal("the first body was not read")
	}
	start := time.Now()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/", bytes.NewReader(big))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("a body past the budget: %d Retry-After %q, want 503 with Retry-After 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if waited := time.Since(start); waited < budgetWait {
		t.Fatalf("answered 503 after %v, without waiting for room", waited)
	}
	if code, body := post(t, addr, []byte(`{"kind":"step"}`)); code != 200 {
		t.Fatalf("a small body beside them: %d %s", code, body)
	}
	holdOnce.Do(func() { close(hold) })
	if code := <-done; code != 200 {
		t.Fatalf("the held body: %d", code)
	}
	if code, body := post(t, addr, big); code != 200 || body != fmt.Sprint(len(big)) {
		t.Fatalf("the same body once the budget is free: %d %s", code, body)
	}
	if used, limit := InflightBytes(); used != 0 || limit != budget {
		t.Fatalf("after every answer %d of %d bytes are leased", used, limit)
	}
}

// TestBudgetMessageNamesFlag: the 503 says which bound it was and what to do.
func TestBudgetMessageNamesFlag(t *testing.T) {
	msg := budgetFull().Msg
	for _, want := range []string{"--max-inflight-bytes", "nothing stored"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q does not say %q", msg, want)
		}
	}
}
