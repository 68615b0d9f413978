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
// Retry-After, so that senders keep the batch and try again. A large
// NDJSON body is checked whole, then written a chunk at a time (chunks.go).
package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/httplimit"
	"github.com/deepseed/deepseed/store"
)

// DefaultMaxBodyBytes bounds a request body when Options leaves it zero.
const DefaultMaxBodyBytes = httplimit.DefaultMaxBodyBytes

// RetryAfterSeconds is what a 503 asks senders to wait.
const RetryAfterSeconds = 5

// writeTimeout bounds one batch's database work.
const writeTimeout = time.Minute

// Options configures the ingest handlers.
type Options struct {
	// MaxBodyBytes bounds a request body after decompression; 0 means 32 MiB.
	MaxBodyBytes int64
	// MaxBatchRows bounds the rows a body expands to (api.Record.Rows);
	// 0 means httplimit.DefaultMaxBatchRows. A body past it gets 413.
	MaxBatchRows int
	Logger       *slog.Logger
	// SetUp, when set, returns a channel closed once the database's tables
	// are set up (store.SetupMode), or nil when there is nothing to wait
	// for. Until it is closed a write waits, setUpWait at most, then is
	// answered 503: a table being turned into a TimescaleDB hypertable has
	// its rows moved into chunks, and a COPY that waited for that went on
	// into the table itself, where no query of the hypertable sees it
	// (acknowledged, and lost).
	SetUp func() <-chan struct{}
}

// setUpWait bounds how long a write waits for the tables' setup.
const setUpWait = RetryAfterSeconds * time.Second

// Handler serves the ingest routes.
type Handler struct {
	store *store.Store
	comb  *combiner
	opt   Options
	log   *slog.Logger
	m     *metrics
	// health is what /readyz learns of the writes (WritesFailing).
	health writeHealth
}

// New returns the ingest handlers over s.
func New(s *store.Store, opt Options) *Handler {
	if opt.MaxBodyBytes <= 0 {
		opt.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opt.MaxBatchRows <= 0 {
		opt.MaxBatchRows = httplimit.DefaultMaxBatchRows
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
	// retryAfter, when not 0, replaces RetryAfterSeconds in a 503.
	retryAfter int
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
	body, lease, herr := h.readBody(c, httplimit.ReadBodyStream)
	// Decoded records copy what they keep from the body, so its buffers
	// can serve the next request once this one is answered.
	defer lease.Release()
	if herr != nil {
		h.m.rejectedTotal("body").Inc()
		return h.answerError(c, herr)
	}
	if len(body) > streamMinBytes && api.IsNDJSON(body) {
		return h.ingestChunks(c, body, lease)
	}
	// Decoded whole: an array, or a body of a few chunks at most.
	if err := lease.Room(c.Request().Context(), httplimit.WholeRoom(len(body), 0)); err != nil {
		h.m.rejectedTotal("body").Inc()
		return h.answerError(c, limitError(err))
	}
	recs, err := api.DecodeBatchWithin(body, h.opt.MaxBatchRows)
	if err != nil {
		return h.rejectDecode(c, err)
	}
	// The rows are held until the store has them: within the budget.
	if herr := h.growLease(c, lease, len(body), recs); herr != nil {
		return h.answerError(c, herr)
	}
	// Steps sent as one steps record are stored, counted and combined
	// as the step records they hold.
	recs = api.ExpandSteps(recs)
	res, herr := h.write(c.Request(), recs, nil)
	if herr != nil {
		return h.answerError(c, herr)
	}
	return c.JSON(http.StatusOK, res)
}

func (h *Handler) rejectDecode(c echo.Context, err error) error {
	if herr := httplimit.TooManyRows(err); herr != nil {
		h.m.rejectedTotal("rows").Inc()
		return c.JSON(herr.Status, api.Error{Error: herr.Msg})
	}
	var re *api.RecordError
	if errors.As(err, &re) {
		h.m.rejectedTotal(re.Kind).Inc()
		return c.JSON(http.StatusBadRequest, api.Error{Error: "invalid batch, nothing stored: " + re.Error(), Record: re})
	}
	h.m.rejectedTotal("body").Inc()
	return c.JSON(http.StatusBadRequest, api.Error{Error: "invalid batch, nothing stored: " + err.Error()})
}

func (h *Handler) answerError(c echo.Context, herr *httpError) error {
	switch {
	case herr.retryAfter > 0:
		c.Response().Header().Set("Retry-After", fmt.Sprint(herr.retryAfter))
	case herr.status == http.StatusServiceUnavailable:
		c.Response().Header().Set("Retry-After", fmt.Sprint(RetryAfterSeconds))
	}
	return c.JSON(herr.status, herr.body)
}

// clientGone answers a request whose sender left before its answer.
var clientGone = &httpError{status: httplimit.StatusClientClosedRequest,
	body: api.Error{Error: "the client closed the request before its answer; nothing stored"}}

// write hands a decoded batch of request req to the store and counts it;
// at places it in its body when it is one chunk of it (nil: the whole).
func (h *Handler) write(req *http.Request, recs []api.Record, at *chunkAt) (api.IngestResult, *httpError) {
	ctx, cancel := context.WithTimeout(req.Context(), writeTimeout)
	defer cancel()
	if herr := h.waitSetUp(ctx); herr != nil {
		return api.IngestResult{}, herr
	}
	start := time.Now()
	res, err := h.comb.write(ctx, recs)
	h.m.write.Update(time.Since(start).Seconds())
	if store.IsDataError(err) {
		return api.IngestResult{}, h.refused(ctx, recs, err, at)
	}
	if err != nil && httplimit.ClientGone(req) {
		// The sender went away: it keeps the batch and sends it again
		// (nothing of it is stored). Not the database's failure.
		h.log.Debug("sender went away before the batch was stored", "records", len(recs), "err", err)
		return api.IngestResult{}, clientGone
	}
	h.health.note(err)
	if err != nil {
		return api.IngestResult{}, h.storeError(err, "storing the batch")
	}
	for kind, n := range res.ByKind {
		h.m.records.With(kind).Add(n)
	}
	h.m.duplicates.Add(res.Duplicates)
	return api.IngestResult{Accepted: res.Accepted, Duplicates: res.Duplicates, ByKind: res.ByKind}, nil
}

// readBody reads the request body with read (httplimit.ReadBodyStream or
// ReadBodyLease), within the limit and the process's memory budget;
// releasing the lease hands its buffers back.
func (h *Handler) readBody(c echo.Context, read func(*http.Request, int64) ([]byte, *httplimit.Lease, *httplimit.Error)) (body []byte, lease *httplimit.Lease, herr *httpError) {
	body, lease, err := read(c.Request(), h.opt.MaxBodyBytes)
	if err != nil {
		return nil, lease, limitError(err)
	}
	return body, lease, nil
}

// growLease makes the request's lease hold what decoding its body of n
// bytes whole took and the rows recs expand to.
func (h *Handler) growLease(c echo.Context, lease *httplimit.Lease, n int, recs []api.Record) *httpError {
	rows := 0
	for _, r := range recs {
		rows += r.Rows()
	}
	if err := lease.Room(c.Request().Context(), httplimit.WholeRoom(n, rows)); err != nil {
		h.m.rejectedTotal("body").Inc()
		return limitError(err)
	}
	return nil
}

func limitError(err *httplimit.Error) *httpError {
	return &httpError{status: err.Status, body: api.Error{Error: err.Error()}, retryAfter: err.RetryAfter}
}

// settingUp answers a write that came while the tables are set up.
var settingUp = &httpError{status: http.StatusServiceUnavailable,
	body: api.Error{Error: fmt.Sprintf("server starting: database setup in progress, nothing stored; retry in %d s", RetryAfterSeconds)}}

// waitSetUp waits until the tables are set up (Options.SetUp), setUpWait at
// most; a settingUp error when they are not by then.
func (h *Handler) waitSetUp(ctx context.Context) *httpError {
	if h.opt.SetUp == nil {
		return nil
	}
	done := h.opt.SetUp()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	t := time.NewTimer(setUpWait)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return clientGone
	case <-t.C:
		h.log.Warn("write refused: the server is still setting up its database", "retry_in_s", RetryAfterSeconds)
		return settingUp
	}
}
