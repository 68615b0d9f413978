package httplimit

import (
	"bytes"
	"fmt"
	"io"
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

// slowReader hands out its bytes a chunk at a time with a pause between,
// as a client sending over a slow link does.
type slowReader struct {
	b     []byte
	chunk int
	pause time.Duration
}

func (s *slowReader) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	time.Sleep(s.pause)
	n := copy(p[:min(len(p), s.chunk)], s.b)
	s.b = s.b[n:]
	return n, nil
}

// TestBudgetLetsSomeLargeBodiesFinish: many large bodies arriving slowly
// at once, more than the budget holds together. Those that got their
// lease finish with 200; the others are answered 503 with Retry-After
// (their senders send them again); none is cut halfway for want of room
// after it was let in, and the budget is whole once all are answered.
func TestBudgetLetsSomeLargeBodiesFinish(t *testing.T) {
	const budget = 24 << 20
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
		fmt.Fprint(w, len(body))
	}))
	body := bytes.Repeat([]byte("y"), 6<<20) // with its decoding, about 18 MiB: one fits, not eight
	const senders = 8
	codes := make(chan int, senders)
	var wg sync.WaitGroup
	for range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/",
				&slowReader{b: body, chunk: 256 << 10, pause: 20 * time.Millisecond})
			req.ContentLength = int64(len(body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				codes <- 0
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && string(b) != fmt.Sprint(len(body)) {
				codes <- -1
				return
			}
			if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
				codes <- -2
				return
			}
			codes <- resp.StatusCode
		}()
	}
	wg.Wait()
	close(codes)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	if count[200] == 0 || count[200]+count[http.StatusServiceUnavailable] != senders {
		t.Fatalf("answers %v: want some 200 and the rest 503 with Retry-After", count)
	}
	if used, _ := InflightBytes(); used != 0 {
		t.Fatalf("after every answer %d bytes are leased", used)
	}
}

// TestStreamLeaseHoldsOneChunk: a body read to be decoded a chunk at a
// time leases its bytes and one chunk's room, not what decoding it whole
// takes; room once leased is reused, and grows only when asked for more
// (a body decoded whole after all).
func TestStreamLeaseHoldsOneChunk(t *testing.T) {
	const size = 12 << 20
	var held, again, whole int64
	addr := serve(t, Limits{MaxInflightBytes: DefaultMaxInflightBytes}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, lease, err := ReadBodyStream(r, 32<<20)
		defer lease.Release()
		if err != nil {
			http.Error(w, err.Error(), err.Status)
			return
		}
		held, _ = InflightBytes()
		if err := lease.Room(r.Context(), StreamRoom); err != nil {
			http.Error(w, err.Error(), err.Status)
			return
		}
		again, _ = InflightBytes()
		if err := lease.Room(r.Context(), WholeRoom(len(body), 0)); err != nil {
			http.Error(w, err.Error(), err.Status)
			return
		}
		whole, _ = InflightBytes()
		fmt.Fprint(w, len(body))
	}))
	if code, body := post(t, addr, bytes.Repeat([]byte("x"), size)); code != 200 || body != fmt.Sprint(size) {
		t.Fatalf("%d %s", code, body)
	}
	if held < size+StreamRoom || held > size+StreamRoom+4*leaseChunk {
		t.Errorf("a %d-byte body read to stream leased %d bytes, want its bytes and one chunk's room (%d)", size, held, size+StreamRoom)
	}
	if again != held {
		t.Errorf("room already leased was leased again: %d bytes, then %d", held, again)
	}
	if whole < size+decodeFactor*size {
		t.Errorf("room for decoding it whole: %d bytes leased, want at least %d", whole, size+decodeFactor*size)
	}
	if used, _ := InflightBytes(); used != 0 {
		t.Fatalf("%d bytes leased after the answer", used)
	}
}
