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
// are rolled back, so nothing of the batch is stored.
func (h *Handler) refused(ctx context.Context, recs []api.Record, cause error) *httpError {
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
	body := api.Error{Error: "invalid batch, nothing stored: the database refused a value: " + msg}
	if hi-lo == 1 && store.IsDataError(h.store.CheckBatch(ctx, recs[lo:hi])) {
		kind := recs[lo].Kind()
		body.Record = &api.RecordError{Index: lo, Kind: kind, Msg: "the database refused a value: " + msg}
		body.Error = fmt.Sprintf("invalid batch, nothing stored: record %d (%s): the database refused a value: %s", lo, kind, msg)
	}
	return &httpError{status: http.StatusBadRequest, body: body}
}
