package httplimit

import (
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
// past the bound is answered 503 with Retry-After at once (and closed
// once its request is read), instead of waiting unseen in the kernel's
// queue: a sender that retries
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

// A refused connection is closed only once the client has read the
// answer: closed at once, with the client's request still arriving,
// the kernel resets the connection and the client may see the reset
// instead of the 503. So the answer is followed by the end of the
// server's side, and what the client sends is read, up to lingerBytes
// and lingerTimeout, before the close; at most maxLingering connections
// at a time, past which one is closed at once as before.
const (
	maxLingering  = 256
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
	// A fresh connection's send buffer is empty: the write does not wait,
	// and the deadline makes sure of it.
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = c.Write(busy)
	select {
	case l.lingering <- struct{}{}:
		go func() {
			defer func() { <-l.lingering }()
			lingerClose(c)
		}()
	default:
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
