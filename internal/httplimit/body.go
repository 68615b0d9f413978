package httplimit

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/klauspost/compress/gzip"
)

// Error is a request body refused: the status to answer and why, in words
// a sender can act on.
type Error struct {
	Status int
	Msg    string
	// RetryAfter, when not 0, is the Retry-After of the answer, in seconds.
	RetryAfter int
}

func (e *Error) Error() string { return e.Msg }

// ReadBody reads r's body into memory, gunzipping it when it says so or
// when it starts with the gzip magic bytes (senders behind proxies lose
// the header). The limit applies before and after decompression, so a
// small gzip bomb is refused with 413 as surely as a large body.
//
// Memory follows what arrives, never what the request announces: a
// Content-Length over the limit is refused before anything is read, and
// one within it reserves nothing. A body not received within the
// server's body timeout (see [Limits]) is answered 408.
//
// The body lives in pooled buffers: release hands them back, and the body
// must not be used after it. A batch is a few hundred kilobytes, and
// allocating (and zeroing, and collecting) that twice per request cost more
// CPU than decompressing it.
func ReadBody(r *http.Request, limit int64) (body []byte, release func(), err *Error) {
	body, lease, err := ReadBodyLease(r, limit)
	return body, lease.Release, err
}

// ReadBodyLease is [ReadBody] within the process's memory budget (see
// [SetMaxInflightBytes]): the body is leased as it arrives and, once in,
// for what decoding it takes; the caller grows the lease for the rows it
// expands to and releases it, with the body's buffers, once answered. A
// body the budget has no room for is answered 503 with Retry-After.
func ReadBodyLease(r *http.Request, limit int64) (body []byte, lease *Lease, err *Error) {
	return readBodyLease(r, limit, wholeRoom)
}

// ReadBodyStream is [ReadBodyLease] for a caller that decodes a large body
// a chunk at a time (see api.EachNDJSON): beside the body, the lease holds
// room for decoding a small body whole, or at most StreamRoom, which the
// caller reuses chunk after chunk and grows with [Lease.Room] where a chunk
// needs more (or the body is to be decoded whole after all).
func ReadBodyStream(r *http.Request, limit int64) (body []byte, lease *Lease, err *Error) {
	return readBodyLease(r, limit, streamRoom)
}

// StreamRoom is what a body decoded a chunk at a time leases beside its
// bytes: the decoding of one chunk of StreamChunkBytes and its rows, at
// most StreamChunkRows.
const StreamRoom = decodeFactor*StreamChunkBytes + StreamChunkRows*RowBytes

// A body decoded a chunk at a time goes to the store in chunks of at most
// StreamChunkRows rows and StreamChunkBytes of its text (a record longer
// than that is a chunk of its own).
const (
	StreamChunkRows  = 4096
	StreamChunkBytes = 2 << 20
)

// WholeRoom is what decoding a body of n bytes whole and holding the rows
// it expands to takes, for [Lease.Room].
func WholeRoom(n, rows int) int64 { return decodeFactor*int64(n) + int64(rows)*RowBytes }

// wholeRoom and streamRoom are what decoding a body of n bytes is leased,
// whole or a chunk at a time.
func wholeRoom(n int64) int64  { return decodeFactor * n }
func streamRoom(n int64) int64 { return min(decodeFactor*n, StreamRoom) }

func readBodyLease(r *http.Request, limit int64, room func(int64) int64) (body []byte, lease *Lease, err *Error) {
	lease = &Lease{}
	body, release, err := readBody(r, limit, lease, room)
	if err == nil {
		err = lease.Room(r.Context(), room(int64(len(body))))
	}
	if err != nil {
		release()
		lease.Release()
		return nil, lease, err
	}
	lease.release = release
	return body, lease, nil
}

func readBody(r *http.Request, limit int64, lease *Lease, room func(int64) int64) (body []byte, release func(), err *Error) {
	ctx := r.Context()
	tooLarge := &Error{Status: http.StatusRequestEntityTooLarge,
		Msg: fmt.Sprintf("request body larger than %d bytes, nothing stored; send smaller batches", limit)}
	if r.ContentLength > limit {
		return nil, noRelease, tooLarge
	}
	enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding")))
	rawBuf := getBuffer()
	// What a plain body decodes to is leased with it; a compressed one's
	// output is leased as it is decompressed.
	var plainRoom func(int64) int64 // nil: a compressed body's is leased later
	if enc == "" || enc == "identity" {
		plainRoom = room
	}
	raw, rerr := readLimited(ctx, rawBuf, r.Body, limit, r.ContentLength, plainRoom, lease)
	if rerr != nil {
		putBuffer(rawBuf)
		return nil, noRelease, readError(rerr, tooLarge, "reading request body: ")
	}
	switch {
	case enc == "gzip" || enc == "x-gzip" || bytes.HasPrefix(raw, []byte{0x1f, 0x8b}):
		defer putBuffer(rawBuf)
		zr, zerr := getGzipReader(raw)
		if zerr != nil {
			return nil, noRelease, &Error{Status: http.StatusBadRequest, Msg: "body is not valid gzip: " + zerr.Error()}
		}
		defer gzipReaders.Put(zr)
		// A few decompressions at once: each may grow to the limit before
		// it is known to be a bomb, and sixteen bombs at once must not
		// take sixteen times that.
		select {
		case gunzipSlots <- struct{}{}:
		case <-r.Context().Done():
			return nil, noRelease, &Error{Status: StatusClientClosedRequest, Msg: "the client closed the request before its body was read"}
		}
		defer func() { <-gunzipSlots }()
		outBuf := getBuffer()
		out, gerr := readGzip(ctx, outBuf, zr, limit, gzipSizeHint(raw), lease)
		if gerr != nil {
			putBuffer(outBuf)
			return nil, noRelease, readError(gerr, tooLarge, "body is not valid gzip: ")
		}
		return out, func() { putBuffer(outBuf) }, nil
	case enc == "" || enc == "identity":
		return raw, func() { putBuffer(rawBuf) }, nil
	default:
		putBuffer(rawBuf)
		return nil, noRelease, &Error{Status: http.StatusUnsupportedMediaType,
			Msg: fmt.Sprintf("unsupported Content-Encoding %q (want gzip or none)", enc)}
	}
}

// readError turns a failed read into the answer: 413 past the limit, 408
// when the body did not arrive in time, else 400 with what went wrong.
func readError(err error, tooLarge *Error, prefix string) *Error {
	var te *bodyTimeoutError
	var le *Error
	switch {
	case errors.As(err, &le):
		return le
	case errors.Is(err, errTooLarge):
		return tooLarge
	case errors.As(err, &te):
		return &Error{Status: http.StatusRequestTimeout, Msg: te.Error() + "; nothing stored, send the request again"}
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &Error{Status: http.StatusRequestTimeout, Msg: "request body not received in time; nothing stored, send the request again"}
	}
	return &Error{Status: http.StatusBadRequest, Msg: prefix + err.Error()}
}

func noRelease() {}

var errTooLarge = errors.New("body too large")

// maxPooledBuffer bounds the buffers kept for reuse, so that one huge
// import does not pin its memory for good.
const maxPooledBuffer = 8 << 20

var (
	buffers     sync.Pool // *bytes.Buffer
	gzipReaders sync.Pool // *gzip.Reader
)

func getBuffer() *bytes.Buffer {
	if b, ok := buffers.Get().(*bytes.Buffer); ok {
		b.Reset()
		return b
	}
	return new(bytes.Buffer)
}

func putBuffer(b *bytes.Buffer) {
	if b.Cap() <= maxPooledBuffer {
		buffers.Put(b)
	}
}

// getGzipReader returns a reader of the gzip stream z, reusing one whose
// decompression tables are already allocated. The caller puts it back.
func getGzipReader(z []byte) (*gzip.Reader, error) {
	if zr, ok := gzipReaders.Get().(*gzip.Reader); ok {
		if err := zr.Reset(bytes.NewReader(z)); err != nil {
			gzipReaders.Put(zr)
			return nil, err
		}
		return zr, nil
	}
	return gzip.NewReader(bytes.NewReader(z))
}

// readLimited reads r to its end into buf, failing with errTooLarge past
// limit bytes. The buffer grows with what arrives, leased a chunk at a
// time: a client that announces a large body and sends nothing holds next
// to nothing. A large body whose length was announced (announced, -1 when
// not) and whose first chunk has arrived leases all it will need at once,
// its bytes and, for a plain one, what decoding them takes (room): of many large
// bodies at once,
// those that got their lease finish and the others are answered 503 before
// they are read, instead of each holding part of the budget while none can
// finish.
func readLimited(ctx context.Context, buf *bytes.Buffer, r io.Reader, limit, announced int64, room func(int64) int64, lease *Lease) ([]byte, error) {
	lr := io.LimitReader(r, limit+1)
	var leased int64
	reserve := announced > smallBody && announced <= limit
	for {
		if reserve && buf.Len() >= leaseChunk {
			reserve = false
			size := announced + 2*leaseChunk
			var decode int64
			if room != nil {
				decode = room(announced)
			}
			if err := lease.Grow(ctx, max(0, size-leased)+decode); err != nil {
				return nil, err
			}
			lease.prepaid = decode
			leased = max(leased, size)
			buf.Grow(int(size) - buf.Len())
		}
		// Leased by what the buffer holds, not what it was given: growing
		// takes a new array of about twice the old one.
		if buf.Available() < leaseChunk {
			if want := int64(2*buf.Cap() + leaseChunk); want > leased {
				if err := lease.Grow(ctx, want-leased); err != nil {
					return nil, err
				}
				leased = want
			}
			buf.Grow(leaseChunk)
		}
		b := buf.AvailableBuffer()[:leaseChunk]
		n, err := lr.Read(b)
		buf.Write(b[:n]) // in place: b is buf's own storage
		if int64(buf.Len()) > limit {
			return nil, errTooLarge
		}
		if err == io.EOF {
			return buf.Bytes(), nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// gunzipSlots bounds the decompressions under way in the process.
var gunzipSlots = make(chan struct{}, 4)

// readGzip decompresses r into buf, failing with errTooLarge past limit
// bytes. Its memory is bounded by about the limit: a body whose stream
// declares its size (at most the limit) is read straight into a buffer of
// that size; any other is read into slabs of gzipSlab bytes kept for reuse,
// joined once it is known to fit. A bomb thus costs the slabs it filled,
// which the next one reuses, instead of a buffer doubled again and again.
func readGzip(ctx context.Context, buf *bytes.Buffer, r io.Reader, limit, hint int64, lease *Lease) ([]byte, error) {
	if hint > 0 && hint <= limit {
		if err := lease.GrowDecompressing(ctx, hint); err != nil {
			return nil, err
		}
		buf.Grow(int(hint) + bytes.MinRead)
		b := buf.AvailableBuffer()[:0]
		n, err := io.ReadFull(r, b[:hint+1])
		switch {
		case err == io.ErrUnexpectedEOF || err == io.EOF:
			buf.Write(b[:n]) // in place: b is buf's own storage
			return buf.Bytes(), nil
		case err != nil:
			return nil, err
		}
		// The stream is longer than it said: go on in slabs.
		return readSlabs(ctx, buf, io.MultiReader(bytes.NewReader(b[:n]), r), limit, lease)
	}
	return readSlabs(ctx, buf, r, limit, lease)
}

const gzipSlab = 1 << 20

var slabs = sync.Pool{New: func() any { b := make([]byte, gzipSlab); return &b }}

// readSlabs leases all a decompression of unknown size may take, the
// limit, before it starts, rather than a slab at a time: decompressions
// that each held part of the budget could otherwise all wait for the rest
// at once (a few bombs together), none finishing. What it joins the slabs
// into is within the same lease: the slabs go back to the pool once joined.
func readSlabs(ctx context.Context, buf *bytes.Buffer, r io.Reader, limit int64, lease *Lease) ([]byte, error) {
	if err := lease.GrowDecompressing(ctx, limit); err != nil {
		return nil, err
	}
	var held []*[]byte
	defer func() {
		for _, s := range held {
			slabs.Put(s)
		}
	}()
	var total int64
	last := 0 // bytes used in the last slab
	for {
		if len(held) == 0 || last == gzipSlab {
			held = append(held, slabs.Get().(*[]byte))
			last = 0
		}
		s := *held[len(held)-1]
		n, err := r.Read(s[last:])
		last += n
		total += int64(n)
		if total > limit {
			return nil, errTooLarge
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	buf.Grow(int(total))
	for i, s := range held {
		if i == len(held)-1 {
			buf.Write((*s)[:last])
		} else {
			buf.Write(*s)
		}
	}
	return buf.Bytes(), nil
}

// gzipSizeHint returns the uncompressed size a single-member gzip stream
// records in its last four bytes. It is only a hint: the size is modulo
// 4 GiB and a sender may lie, so readGzip bounds it by the limit and
// still enforces the limit on what it reads. The compressed body it comes
// from is already in memory, so a lie costs at most one buffer of the
// limit for one of the few decompressions under way.
func gzipSizeHint(z []byte) int64 {
	if len(z) < 18 {
		return 0
	}
	return int64(binary.LittleEndian.Uint32(z[len(z)-4:]))
}
