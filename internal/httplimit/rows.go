package httplimit

import (
	"errors"
	"net/http"

	"github.com/deepseed/deepseed/api"
)

// TooManyRows turns a decode error that is a batch past its row bound
// (api.RowsError) into its answer: 413, naming the bound and the flag that
// sets it. It returns nil for any other error.
func TooManyRows(err error) *Error {
	var re *api.RowsError
	if !errors.As(err, &re) {
		return nil
	}
	return &Error{Status: http.StatusRequestEntityTooLarge,
		Msg: re.Error() + ", nothing stored; send smaller batches, or raise --max-batch-rows (DEEPSEED_MAX_BATCH_ROWS)"}
}
