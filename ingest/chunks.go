package ingest

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/httplimit"
)

// A large NDJSON body goes to the store in chunks, never decoded whole:
// what it costs beside its bytes is one chunk's records and rows
// (httplimit.StreamRoom), reused chunk after chunk, where decoding it whole
// took about twice its bytes and a kilobyte a row more.
//
// The body is read twice. The first pass decodes and validates every line
// and keeps nothing, so that a body with a bad line, or past the rows
// bound, is refused as a body decoded whole is, before anything of it is
// stored: 400 naming the line, or 413. The second decodes it again a chunk
// at a time, and each chunk is written in its own transaction, in the
// body's order; the body is answered 200 once the last is stored. A body
// whose write fails part way (503, the sender gone) has its first chunks
// stored and the sender sends it all again: every merge of the store is
// keyed (steps, layers and evaluations by run, rank or split and step,
// samples and events by their keys), so the chunks stored before count as
// duplicates and nothing is stored twice.

// streamMinBytes is the size past which an NDJSON body is stored a chunk
// at a time. Below it a body is decoded whole and written in one
// transaction, as a collector's batches (4 MiB at most) always are.
const streamMinBytes = 4 * httplimit.StreamChunkBytes

// chunkAt places one chunk of a body: the body's record and line of each
// of its rows, and whether chunks before it were stored.
type chunkAt struct {
	index, lines []int
	stored       bool
}

// ingestChunks stores an NDJSON body a chunk at a time (see above).
func (h *Handler) ingestChunks(c echo.Context, body []byte, lease *httplimit.Lease) error {
	req := c.Request()
	if _, _, err := api.EachNDJSON(body, h.opt.MaxBatchRows, nil); err != nil {
		return h.rejectDecode(c, err)
	}
	total := api.IngestResult{ByKind: map[string]int{}}
	var (
		chunk        []api.Record
		index, lines []int
		chunkBytes   int
		records      int
		stored       bool
	)
	flush := func() *httpError {
		if len(chunk) == 0 {
			return nil
		}
		// Within the room leased with the body unless one record is
		// larger than a chunk.
		if err := lease.Room(req.Context(), httplimit.WholeRoom(chunkBytes, len(chunk))); err != nil {
			h.m.rejectedTotal("body").Inc()
			return limitError(err)
		}
		res, herr := h.write(req, chunk, &chunkAt{index: index, lines: lines, stored: stored})
		if herr != nil {
			return herr
		}
		stored = true
		total.Accepted += res.Accepted
		total.Duplicates += res.Duplicates
		for k, n := range res.ByKind {
			total.ByKind[k] += n
		}
		clear(chunk) // the records are garbage once stored
		chunk, index, lines, chunkBytes = chunk[:0], index[:0], lines[:0], 0
		return nil
	}
	var failed *httpError
	_, _, err := api.EachNDJSON(body, h.opt.MaxBatchRows, func(line int, raw []byte, rec api.Record) error {
		i := records
		records++
		// Steps sent as one steps record are stored, counted and
		// combined as the step records they hold; all of them are
		// decoded, and held in the lease, until the last is stored.
		if rec.Steps != nil {
			if err := lease.Room(req.Context(), httplimit.WholeRoom(chunkBytes+len(raw), len(chunk)+len(rec.Steps))); err != nil {
				h.m.rejectedTotal("body").Inc()
				failed = limitError(err)
				return failed
			}
			for _, s := range rec.Steps {
				chunk, index, lines = append(chunk, api.Record{Step: s}), append(index, i), append(lines, line)
				if len(chunk) >= httplimit.StreamChunkRows {
					if failed = flush(); failed != nil {
						return failed
					}
				}
			}
		} else {
			chunk, index, lines = append(chunk, rec), append(index, i), append(lines, line)
		}
		chunkBytes += len(raw)
		if len(chunk) >= httplimit.StreamChunkRows || chunkBytes >= httplimit.StreamChunkBytes {
			failed = flush()
		}
		if failed != nil {
			return failed
		}
		return nil
	})
	if failed == nil && err != nil {
		// The first pass accepted the body, and decoding is the same
		// every time: this cannot be, but it is not stored as valid.
		return h.rejectDecode(c, err)
	}
	if failed == nil {
		failed = flush()
	}
	if failed != nil {
		return h.answerError(c, failed)
	}
	return c.JSON(http.StatusOK, total)
}
