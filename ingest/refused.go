package ingest

import (
	"context"
	"fmt"
	"net/http"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// refused answers a batch the database refused for one of its values. The
// validator is meant to catch every such value first; this is the
// defence behind it, so that a value it misses is still the sender's 400
// (and the batch's dead letter at a collector), never a 500 retried for
// ever. The record at fault is found by halving the batch with writes that
// are rolled back, so nothing of the batch is stored. A batch that is one
// chunk of a body (at) is named by its body's lines; the chunks before it
// are stored.
func (h *Handler) refused(ctx context.Context, recs []api.Record, cause error, at *chunkAt) *httpError {
	h.m.rejectedTotal("body").Inc()
	h.log.Warn("the database refused a value the validator let through", "records", len(recs), "err", cause)
	lo, hi := 0, len(recs)
	for hi-lo > 1 && ctx.Err() == nil {
		mid := (lo + hi) / 2
		if err := h.store.CheckBatch(ctx, recs[lo:mid]); store.IsDataError(err) {
			hi = mid
		} else {
			lo = mid
		}
	}
	msg := store.DataErrorMessage(cause)
	what := "invalid batch, nothing stored"
	if at != nil && at.stored {
		what = fmt.Sprintf("invalid batch, the records before line %d stored and none from it on", at.lines[0])
	}
	body := api.Error{Error: what + ": the database refused a value: " + msg}
	if hi-lo == 1 && store.IsDataError(h.store.CheckBatch(ctx, recs[lo:hi])) {
		kind := recs[lo].Kind()
		body.Record = &api.RecordError{Index: lo, Kind: kind, Msg: "the database refused a value: " + msg}
		where := fmt.Sprintf("record %d", lo)
		if at != nil {
			body.Record.Index, body.Record.Line = at.index[lo], at.lines[lo]
			where = fmt.Sprintf("line %d", at.lines[lo])
		}
		body.Error = fmt.Sprintf("%s: %s (%s): the database refused a value: %s", what, where, kind, msg)
	}
	return &httpError{status: http.StatusBadRequest, body: body}
}
