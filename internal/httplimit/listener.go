package httplimit

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// busy is the whole answer to a connection over the bound.
var busy = func() []byte {
	body := `{"error":"too many connections to this listener; retry in a second"}` + "\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n" +
		"Connection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

// Listener returns ln bounded to MaxConns open connections. A connection
// past the bound is answered 503 with Retry-After once its request has
// come (and closed once the client has read it), instead of waiting
// unseen in the kernel's queue: a sender that retries
// (the hook, the collector) tries again, and the connections already open
// keep being served. The refusals are logged at most once a minute.
// MaxConns left zero takes the default.
func (l Limits) Listener(ln net.Listener, log *slog.Logger) net.Listener {
	l = l.WithDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &limitListener{Listener: ln, slots: make(chan struct{}, l.MaxConns), lingering: make(chan struct{}, maxLingering), log: log}
}

// A refused connection is answered once its request's head has arrived
// (up to headWait), and closed once the client has read the answer. An
// answer written before the request reaches a client that has not sent
// it yet, which Go's client drops as unsolicited and reports as a failed
// request; and a connection closed with the client's request still
// arriving is reset by the kernel, the answer lost with it. So the
// server reads the request's head, answers, ends its side and reads what
// the client still sends, up to lingerBytes and lingerTimeout, before the
// close: at most maxLingering connections at a time, past which one is
// answered and closed at once.
const (
	maxLingering  = 256
	headWait      = time.Second
	lingerBytes   = 64 << 10
	lingerTimeout = 2 * time.Second
)

type limitListener struct {
	net.Listener
	slots     chan struct{}
	lingering chan struct{} // refused connections being closed
	log       *slog.Logger
	refused   atomic.Int64
	mu        sync.Mutex
	logged    time.Time
}

// Accept returns the next connection within the bound, answering those
// past it.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
			l.refuse(c)
		}
	}
}

func (l *limitListener) refuse(c net.Conn) {
	select {
	case l.lingering <- struct{}{}:
		go func() {
			defer func() { <-l.lingering }()
			awaitHead(c)
			answerBusy(c)
			lingerClose(c)
		}()
	default:
		answerBusy(c)
		_ = c.Close()
	}
	n := l.refused.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); now.Sub(l.logged) >= time.Minute {
		l.logged = now
		l.log.Warn("connection bound reached: answering new connections 503", "max_conns", cap(l.slots),
			"addr", l.Addr().String(), "refused_total", n)
	}
}

// answerBusy writes the 503. A connection's send buffer holds it without
// waiting, and the deadline makes sure of it.
func answerBusy(c net.Conn) {
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = c.Write(busy)
}

// awaitHead reads c until the blank line that ends a request's head, 4 KiB
// of it, an error or headWait, whichever comes first.
func awaitHead(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(headWait))
	var buf [4 << 10]byte
	n := 0
	for n < len(buf) {
		k, err := c.Read(buf[n:])
		n += k
		if bytes.Contains(buf[max(0, n-k-3):n], []byte("\r\n\r\n")) || err != nil {
			return
		}
	}
}

// lingerClose ends the server's side of c, reads what the client still
// sends (its request) until it closes or the bounds pass, and closes c.
func lingerClose(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(lingerTimeout))
	_, _ = io.CopyN(io.Discard, c, lingerBytes)
	_ = c.Close()
}

// limitConn gives its slot back once, at its first Close.
type limitConn struct {
	net.Conn
	release func()
	once    sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
