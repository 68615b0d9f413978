package httplimit

import (
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
// past the bound is answered 503 with Retry-After and closed at once,
// instead of waiting unseen in the kernel's queue: a sender that retries
// (the hook, the collector) tries again, and the connections already open
// keep being served. The refusals are logged at most once a minute.
// MaxConns left zero takes the default.
func (l Limits) Listener(ln net.Listener, log *slog.Logger) net.Listener {
	l = l.WithDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &limitListener{Listener: ln, slots: make(chan struct{}, l.MaxConns), log: log}
}

type limitListener struct {
	net.Listener
	slots   chan struct{}
	log     *slog.Logger
	refused atomic.Int64
	mu      sync.Mutex
	logged  time.Time
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
	_ = c.Close()
	n := l.refused.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); now.Sub(l.logged) >= time.Minute {
		l.logged = now
		l.log.Warn("connection bound reached: answering new connections 503", "max_conns", cap(l.slots),
			"addr", l.Addr().String(), "refused_total", n)
	}
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
