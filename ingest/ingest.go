// Package ingest serves POST /api/v1/ingest and POST /api/v1/import:
// decode, validate, and hand whole batches to the store.
//
// Usage:
//  1. h := ingest.New(store, ingest.Options{Logger: log})
//  2. h.Register(e.Group("/api/v1", auth)) adds POST /ingest and POST /import.
//
// A batch is all or nothing: one invalid record rejects it with 400 and a
// JSON [api.Error] naming the record, field and problem, and nothing of it
// is stored. When the database cannot be reached the answer is 503 with
// Retry-After, so that senders keep the batch and try again.
package ingest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// DefaultMaxBodyBytes bounds a request body when Options leaves it zero.
const DefaultMaxBodyBytes = 32 << 20

// RetryAfterSeconds is what a 503 asks senders to wait.
const RetryAfterSeconds = 5

// writeTimeout bounds one batch's database work.
const writeTimeout = time.Minute

// Options configures the ingest handlers.
type Options struct {
	// MaxBodyBytes bounds a request body after decompression; 0 means 32 MiB.
	MaxBodyBytes int64
	Logger       *slog.Logger
}

// Handler serves the ingest routes.
type Handler struct {
	store *store.Store
	comb  *combiner
	opt   Options
	log   *slog.Logger
	m     *metrics
}

// New returns the ingest handlers over s.
func New(s *store.Store, opt Options) *Handler {
	if opt.MaxBodyBytes <= 0 {
		opt.MaxBodyBytes = DefaultMaxBodyBytes
	}
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := newMetrics()
	return &Handler{store: s, comb: newCombiner(s, m), opt: opt, log: log.With("component", "ingest"), m: m}
}

// Register adds POST /ingest and POST /import to g (mounted at /api/v1).
func (h *Handler) Register(g *echo.Group) {
	g.POST("/ingest", h.safe(h.ingest))
	g.POST("/import", h.safe(h.importExport))
}

// httpError is an answer other than 200, with the body to send.
type httpError struct {
	status int
	body   api.Error
}

func (e *httpError) Error() string { return e.body.Error }

func badRequest(msg string) *httpError {
	return &httpError{status: http.StatusBadRequest, body: api.Error{Error: msg}}
}

// safe answers 500 instead of letting a panic escape, so bad input can
// never take the server down even where no recover middleware is set.
func (h *Handler) safe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			if p := recover(); p != nil {
				h.log.Error("ingest handler panicked", "panic", fmt.Sprint(p), "path", c.Path())
				err = c.JSON(http.StatusInternalServerError, api.Error{Error: "internal error"})
			}
		}()
		return next(c)
	}
}

func (h *Handler) ingest(c echo.Context) error {
	body, release, herr := h.readBody(c)
	// Decoded records copy what they keep from the body, so its buffers
	// can serve the next request once this one is answered.
	defer release()
	if herr != nil {
		h.m.rejectedTotal("body").Inc()
		return c.JSON(herr.status, herr.body)
	}
	recs, err := api.DecodeBatch(body)
	if err != nil {
		return h.rejectDecode(c, err)
	}
	// Steps sent as one steps record are stored, counted and combined
	// as the step records they hold.
	recs = api.ExpandSteps(recs)
	res, herr := h.write(c.Request().Context(), recs)
	if herr != nil {
		return h.answerError(c, herr)
	}
	return c.JSON(http.StatusOK, res)
}

func (h *Handler) rejectDecode(c echo.Context, err error) error {
	var re *api.RecordError
	if errors.As(err, &re) {
		h.m.rejectedTotal(re.Kind).Inc()
		return c.JSON(http.StatusBadRequest, api.Error{Error: "invalid batch, nothing stored: " + re.Error(), Record: re})
	}
	h.m.rejectedTotal("body").Inc()
	return c.JSON(http.StatusBadRequest, api.Error{Error: "invalid batch, nothing stored: " + err.Error()})
}

func (h *Handler) answerError(c echo.Context, herr *httpError) error {
	if herr.status == http.StatusServiceUnavailable {
		c.Response().Header().Set("Retry-After", fmt.Sprint(RetryAfterSeconds))
	}
	return c.JSON(herr.status, herr.body)
}

// write hands a decoded batch to the store and counts it.
func (h *Handler) write(ctx context.Context, recs []api.Record) (api.IngestResult, *httpError) {
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	start := time.Now()
	res, err := h.comb.write(ctx, recs)
	h.m.write.Observe(time.Since(start).Seconds())
	if store.IsDataError(err) {
		return api.IngestResult{}, h.refused(ctx, recs, err)
	}
	if err != nil {
		return api.IngestResult{}, h.storeError(err, "storing the batch")
	}
	for kind, n := range res.ByKind {
		h.m.records.WithLabelValues(kind).Add(float64(n))
	}
	h.m.duplicates.Add(float64(res.Duplicates))
	return api.IngestResult{Accepted: res.Accepted, Duplicates: res.Duplicates, ByKind: res.ByKind}, nil
}

// readBody reads the request body, gunzipping it when it says so or when
// it starts with the gzip magic bytes (senders behind proxies lose the
// header). The limit applies before and after decompression, so a small
// gzip bomb is refused as surely as a large body.
//
// The body lives in pooled buffers: release hands them back, and the body
// must not be used after it. A batch is a few hundred kilobytes, and
// allocating (and zeroing, and collecting) that twice per request cost more
// CPU than decompressing it.
func (h *Handler) readBody(c echo.Context) (body []byte, release func(), herr *httpError) {
	limit := h.opt.MaxBodyBytes
	tooLarge := &httpError{status: http.StatusRequestEntityTooLarge,
		body: api.Error{Error: fmt.Sprintf("request body larger than %d bytes, nothing stored; send smaller batches", limit)}}
	req := c.Request()
	if req.ContentLength > limit {
		return nil, noRelease, tooLarge
	}
	rawBuf := getBuffer()
	raw, err := readLimited(rawBuf, req.Body, limit, req.ContentLength)
	if err != nil {
		putBuffer(rawBuf)
		if errors.Is(err, errTooLarge) {
			return nil, noRelease, tooLarge
		}
		return nil, noRelease, badRequest("reading request body: " + err.Error())
	}
	enc := strings.ToLower(strings.TrimSpace(req.Header.Get(echo.HeaderContentEncoding)))
	switch {
	case enc == "gzip" || enc == "x-gzip" || bytes.HasPrefix(raw, []byte{0x1f, 0x8b}):
		defer putBuffer(rawBuf)
		zr, err := getGzipReader(raw)
		if err != nil {
			return nil, noRelease, badRequest("body is not valid gzip: " + err.Error())
		}
		defer gzipReaders.Put(zr)
		// A few decompressions at once: each may grow to the limit before
		// it is known to be a bomb, and sixteen bombs at once must not
		// take sixteen times that.
		select {
		case gunzipSlots <- struct{}{}:
		case <-req.Context().Done():
			return nil, noRelease, badRequest("request cancelled")
		}
		defer func() { <-gunzipSlots }()
		outBuf := getBuffer()
		out, err := readGzip(outBuf, zr, limit, gzipSizeHint(raw))
		if err != nil {
			putBuffer(outBuf)
			if errors.Is(err, errTooLarge) {
				return nil, noRelease, tooLarge
			}
			return nil, noRelease, badRequest("body is not valid gzip: " + err.Error())
		}
		return out, func() { putBuffer(outBuf) }, nil
	case enc == "" || enc == "identity":
		return raw, func() { putBuffer(rawBuf) }, nil
	default:
		putBuffer(rawBuf)
		return nil, noRelease, &httpError{status: http.StatusUnsupportedMediaType,
			body: api.Error{Error: fmt.Sprintf("unsupported Content-Encoding %q (want gzip or none)", enc)}}
	}
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
// limit bytes. A body of the size hinted at (-1 or 0 when unknown) is read
// into one buffer of its size instead of regrowing and copying from 512
// bytes.
func readLimited(buf *bytes.Buffer, r io.Reader, limit, hint int64) ([]byte, error) {
	if hint <= 0 || hint > limit {
		hint = 0
	}
	buf.Grow(int(hint) + bytes.MinRead)
	if _, err := buf.ReadFrom(io.LimitReader(r, limit+1)); err != nil {
		return nil, err
	}
	if int64(buf.Len()) > limit {
		return nil, errTooLarge
	}
	return buf.Bytes(), nil
}

// gunzipSlots bounds the decompressions under way.
var gunzipSlots = make(chan struct{}, 4)

// readGzip decompresses r into buf, failing with errTooLarge past limit
// bytes. Its memory is bounded by about the limit: a body whose stream
// declares its size (at most the limit) is read straight into a buffer of
// that size; any other is read into slabs of gzipSlab bytes kept for reuse,
// joined once it is known to fit. A bomb thus costs the slabs it filled,
// which the next one reuses, instead of a buffer doubled again and again.
func readGzip(buf *bytes.Buffer, r io.Reader, limit, hint int64) ([]byte, error) {
	if hint > 0 && hint <= limit {
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
		return readSlabs(buf, io.MultiReader(bytes.NewReader(b[:n]), r), limit)
	}
	return readSlabs(buf, r, limit)
}

const gzipSlab = 1 << 20

var slabs = sync.Pool{New: func() any { b := make([]byte, gzipSlab); return &b }}

func readSlabs(buf *bytes.Buffer, r io.Reader, limit int64) ([]byte, error) {
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
// 4 GiB and a sender may lie, so readLimited bounds it and still enforces
// the limit on what it reads.
func gzipSizeHint(z []byte) int64 {
	if len(z) < 18 {
		return 0
	}
	return int64(binary.LittleEndian.Uint32(z[len(z)-4:]))
}
