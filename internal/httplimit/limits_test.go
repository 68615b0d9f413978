package httplimit

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// serve runs h within l on a loopback port until the test ends and
// returns its address.
func serve(t *testing.T, l Limits, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := l.Server(h, nil)
	go srv.Serve(l.Listener(ln, nil))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// echoLen answers the length of the body ReadBody read, or its error.
func echoLen(limit int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, release, err := ReadBody(r, limit)
		defer release()
		if err != nil {
			http.Error(w, err.Error(), err.Status)
			return
		}
		fmt.Fprint(w, len(body))
	})
}

func post(t *testing.T, addr string, body []byte, header ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/", bytes.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func gz(t *testing.T, b []byte) []byte {
	var out bytes.Buffer
	w := gzip.NewWriter(&out)
	w.Write(b)
	w.Close()
	return out.Bytes()
}

func TestReadBodyLimits(t *testing.T) {
	addr := serve(t, Limits{MaxBodyBytes: 1 << 20}, echoLen(1<<20))
	plain := bytes.Repeat([]byte("x"), 1000)
	if code, got := post(t, addr, plain); code != 200 || got != "1000" {
		t.Errorf("plain body: %d %q", code, got)
	}
	if code, got := post(t, addr, gz(t, plain), "Content-Encoding", "gzip"); code != 200 || got != "1000" {
		t.Errorf("gzip body: %d %q", code, got)
	}
	if code, got := post(t, addr, gz(t, plain)); code != 200 || got != "1000" {
		t.Errorf("gzip body without its header: %d %q", code, got)
	}
	if code, got := post(t, addr, bytes.Repeat([]byte("x"), 1<<20+1)); code != 413 || !strings.Contains(got, "larger than 1048576 bytes") {
		t.Errorf("body over the limit: %d %q", code, got)
	}
	// A bomb: 64 MiB of zeros in about 64 KiB.
	bomb := gz(t, make([]byte, 64<<20))
	if code, got := post(t, addr, bomb, "Content-Encoding", "gzip"); code != 413 || !strings.Contains(got, "larger than") {
		t.Errorf("gzip bomb: %d %q", code, got)
	}
	if code, got := post(t, addr, []byte{0x1f, 0x8b, 1, 2}, "Content-Encoding", "gzip"); code != 400 || !strings.Contains(got, "gzip") {
		t.Errorf("corrupt gzip: %d %q", code, got)
	}
	if code, got := post(t, addr, plain, "Content-Encoding", "br"); code != 415 {
		t.Errorf("unknown encoding: %d %q", code, got)
	}
}

// A Content-Length over the limit is refused before any of the body is
// sent, and one within it that never comes costs no buffer of its size:
// the client that announced it is cut off at the body timeout with 408,
// while other clients are answered meanwhile.
func TestBodyTimeoutCutsOffSilentAndTricklingClients(t *testing.T) {
	addr := serve(t, Limits{MaxBodyBytes: 32 << 20, BodyTimeout: 300 * time.Millisecond}, echoLen(32<<20))

	over, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	fmt.Fprintf(over, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 33<<20)
	resp, err := http.ReadResponse(bufio.NewReader(over), nil)
	if err != nil || resp.StatusCode != 413 {
		t.Fatalf("announced body over the limit: %v %v", resp, err)
	}

	type result struct {
		status int
		closed bool
	}
	slow := func(trickle bool) chan result {
		out := make(chan result, 1)
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer c.Close()
			fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 32<<20)
			stop := make(chan struct{})
			if trickle {
				go func() {
					for {
						select {
						case <-stop:
							return
						case <-time.After(20 * time.Millisecond):
							c.Write([]byte("x"))
						}
					}
				}()
			}
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			close(stop)
			if err != nil {
				out <- result{}
				return
			}
			io.Copy(io.Discard, resp.Body)
			_, err = br.ReadByte() // the server closes the connection after its answer
			out <- result{status: resp.StatusCode, closed: err == io.EOF}
		}()
		return out
	}
	silent, trickling := slow(false), slow(true)
	// Others are answered while the two wait.
	if code, got := post(t, addr, []byte("hello")); code != 200 || got != "5" {
		t.Errorf("another client: %d %q", code, got)
	}
	for name, ch := range map[string]chan result{"silent": silent, "trickling": trickling} {
		r := <-ch
		if r.status != http.StatusRequestTimeout || !r.closed {
			t.Errorf("%s client: status %d, connection closed %v; want 408 and closed", name, r.status, r.closed)
		}
	}
}

// The body deadline ends with the body: a handler that works longer than
// the body timeout after reading it, or a request without a body, keeps
// its context and gets its answer.
func TestBodyTimeoutSparesSlowHandlers(t *testing.T) {
	const timeout = 100 * time.Millisecond
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, release, err := ReadBody(r, 1024)
		defer release()
		if err != nil {
			http.Error(w, err.Error(), err.Status)
			return
		}
		select {
		case <-r.Context().Done():
			http.Error(w, "cancelled", 500)
		case <-time.After(5 * timeout):
			fmt.Fprint(w, len(body))
		}
	})
	addr := serve(t, Limits{BodyTimeout: timeout}, h)
	if code, got := post(t, addr, []byte("abc")); code != 200 || got != "3" {
		t.Errorf("slow handler after its body: %d %q", code, got)
	}
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "0" {
		t.Errorf("slow handler without a body: %d %q", resp.StatusCode, b)
	}
}

// A refused connection is answered once its request has come, and closed
// once the client has read the answer. Answered at accept, a client that
// had not yet sent its request (on a loaded machine) dropped the 503 as
// unsolicited and reported a failed request; closed at once, the server's
// side reset the connection at the client's next write. Either way the
// client saw a connection error instead of the answer it retries on.
func TestRefusedConnectionKeepsItsAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	l := Limits{MaxConns: 1}.Listener(ln, nil).(*limitListener)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	l.refuse(sc)
	// Nothing is answered before the request: Go's client drops an
	// answer that comes before it has sent its request.
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("refused client read %d bytes (%v) before sending its request", n, err)
	}
	_ = c.SetReadDeadline(time.Time{})
	// The request comes in two writes; the second is the one a server
	// that had closed would reset.
	for _, part := range []string{"POST / HTTP/1.1\r\nHost: x\r\n", "Content-Length: 3\r\n\r\nabc"} {
		if _, err := fmt.Fprint(c, part); err != nil {
			t.Fatalf("refused client could not send its request: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("refused client read %v instead of the 503", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("refused client: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// Past MaxConns a connection is answered 503 with Retry-After at once;
// once one closes, the next is served again.
func TestListenerBoundsConnections(t *testing.T) {
	addr := serve(t, Limits{MaxConns: 2}, echoLen(1024))
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// The two are accepted before the third is looked at: a request on
	// each proves it.
	for _, c := range held {
		fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("held connection: %v %v", resp, err)
		}
	}
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("third connection: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(body), "too many connections") {
		t.Fatalf("third connection: %d %q %q", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	held[0].Close()
	for i := 0; ; i++ {
		resp, err := http.Get("http://" + addr + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if i == 200 {
			t.Fatalf("a freed slot was never taken again: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	held[1].Close()
}
