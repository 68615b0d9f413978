// Package httplimit bounds what HTTP clients can make a DeepSeed process
// hold, whoever they are and whatever they announce: the server's API and
// the collector's hook receiver share it.
//
// Usage:
//  1. l := httplimit.Defaults() (then the flags' values)
//  2. srv := l.Server(handler, log) — header and body deadlines, idle
//     connections closed, headers bounded
//  3. srv.Serve(l.Listener(ln, log)) — at most MaxConns connections
//  4. in a handler: body, release, err := httplimit.ReadBody(r, l.MaxBodyBytes)
package httplimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/deepseed/deepseed/api"
)

// Limits are one listener's bounds.
type Limits struct {
	// MaxBodyBytes bounds a request body, before and after decompression.
	MaxBodyBytes int64
	// ReadHeaderTimeout is how long a client may take to send a
	// request's headers.
	ReadHeaderTimeout time.Duration
	// BodyTimeout is how long a client may take to send a request's body
	// once its headers are in; past it the request is answered 408 and
	// the connection closed.
	BodyTimeout time.Duration
	// MaxConns bounds the open connections of the listener; one more is
	// answered 503 once its request has come, and closed once it is read.
	MaxConns int
	// MaxBatchRows bounds the rows an ingest body expands to (each step of
	// a steps record is one, see api.Record.Rows); past it the body is
	// answered 413 and nothing of it is stored.
	MaxBatchRows int
	// MaxInflightBytes bounds what all requests of the process together
	// may hold: bodies, what they decode to and their rows (see
	// [SetMaxInflightBytes]); one more is answered 503 with Retry-After.
	// It is the process's, not one listener's: the last set wins.
	MaxInflightBytes int64
}

// The defaults: a 32 MiB body takes 30 s at 9 Mbit/s, a thousand ranks
// posting to one collector (or one server) over kept-alive connections
// stay well within the connection bound, and at a few tens of kilobytes
// an idle connection the bound stays far below the process's memory.
const (
	DefaultMaxBodyBytes      = 32 << 20
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultBodyTimeout       = time.Minute
	DefaultMaxConns          = 4096
	// DefaultMaxBatchRows takes a hook's largest post (500 steps records of
	// 64 steps) and a collector's (4 MiB of records) with room to spare,
	// while a batch's rows stay at tens of megabytes in memory.
	DefaultMaxBatchRows = 50000
)

// maxHeaderBytes bounds a request's headers; DeepSeed's clients send a
// few hundred bytes of them.
const maxHeaderBytes = 64 << 10

// idleTimeout closes a kept-alive connection that sends nothing, so idle
// clients do not hold the connection bound.
const idleTimeout = 2 * time.Minute

// Defaults returns the default limits.
func Defaults() Limits {
	return Limits{MaxBodyBytes: DefaultMaxBodyBytes, ReadHeaderTimeout: DefaultReadHeaderTimeout,
		BodyTimeout: DefaultBodyTimeout, MaxConns: DefaultMaxConns, MaxBatchRows: DefaultMaxBatchRows,
		MaxInflightBytes: DefaultMaxInflightBytes}
}

// WithDefaults returns l with the fields left zero set to the defaults.
func (l Limits) WithDefaults() Limits {
	d := Defaults()
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = d.MaxBodyBytes
	}
	if l.ReadHeaderTimeout <= 0 {
		l.ReadHeaderTimeout = d.ReadHeaderTimeout
	}
	if l.BodyTimeout <= 0 {
		l.BodyTimeout = d.BodyTimeout
	}
	if l.MaxConns <= 0 {
		l.MaxConns = d.MaxConns
	}
	if l.MaxBatchRows <= 0 {
		l.MaxBatchRows = d.MaxBatchRows
	}
	if l.MaxInflightBytes <= 0 {
		l.MaxInflightBytes = d.MaxInflightBytes
	}
	return l
}

// Validate reports each bad field through bad, with the flag's name.
func (l Limits) Validate(bad func(field, value, msg string)) {
	if l.MaxBodyBytes < 1024 {
		bad("max-body-bytes", strconv.FormatInt(l.MaxBodyBytes, 10), "must be at least 1024")
	}
	if l.ReadHeaderTimeout <= 0 {
		bad("read-header-timeout", l.ReadHeaderTimeout.String(), "must be positive")
	}
	if l.BodyTimeout <= 0 {
		bad("body-timeout", l.BodyTimeout.String(), "must be positive")
	}
	if l.MaxConns < 1 {
		bad("max-conns", strconv.Itoa(l.MaxConns), "must be at least 1")
	}
	if l.MaxBatchRows < 1 || l.MaxBatchRows > api.MaxBatchRecords {
		bad("max-batch-rows", strconv.Itoa(l.MaxBatchRows), fmt.Sprintf("must be from 1 to %d", api.MaxBatchRecords))
	}
	if l.MaxInflightBytes < 1<<20 {
		bad("max-inflight-bytes", strconv.FormatInt(l.MaxInflightBytes, 10), "must be at least 1048576")
	}
}

// Server returns an HTTP server of h within the limits: headers within
// ReadHeaderTimeout and maxHeaderBytes, each body within BodyTimeout,
// idle connections closed after two minutes. Serve it on
// [Limits.Listener] for the connection bound. Fields left zero take the
// defaults.
//
// It also sets the process's memory budget to MaxInflightBytes.
func (l Limits) Server(h http.Handler, log *slog.Logger) *http.Server {
	l = l.WithDefaults()
	SetMaxInflightBytes(l.MaxInflightBytes)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &http.Server{
		Handler:           bodyDeadline(h, l.BodyTimeout),
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// bodyDeadline gives each request with a body d to send it, counted from
// when its headers are in. The deadline is on the connection, so a body
// trickled a byte at a time is cut off as surely as one never sent; it is
// lifted once the body has been read to its end, so a handler that then
// works for longer is not cut off with it. A request without a body gets
// none: Go's server already watches such a connection for the client
// going away.
func bodyDeadline(next http.Handler, d time.Duration) http.Handler {
	if d <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(d)); err == nil {
			r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc, d: d}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody lifts the read deadline at the body's end and names the
// deadline when it passes.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	d    time.Duration
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF && !b.done:
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	case err != nil && errors.Is(err, os.ErrDeadlineExceeded):
		err = &bodyTimeoutError{d: b.d, err: err}
	}
	return n, err
}

// bodyTimeoutError is a body that did not arrive within the body timeout.
type bodyTimeoutError struct {
	d   time.Duration
	err error
}

func (e *bodyTimeoutError) Error() string {
	return fmt.Sprintf("request body not received within %s (the body timeout)", e.d)
}

func (e *bodyTimeoutError) Unwrap() error { return e.err }

// StatusClientClosedRequest is the status recorded (in logs and metrics)
// for a request whose client went away before its answer: nobody reads
// it, and it is neither the server's failure nor the client's error.
const StatusClientClosedRequest = 499

// ClientGone reports whether r's client closed the connection (or the
// server is shutting it down) before the answer: a failure after that is
// the cancellation's doing, logged at debug and answered 499, not a 500.
func ClientGone(r *http.Request) bool {
	return errors.Is(r.Context().Err(), context.Canceled)
}
