package query

import (
	"slices"
	"unicode"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
)

// evalType is the annotation type of evaluations, which come from the
// evals table rather than the events table.
const evalType = "eval"

// alertType is the annotation type of alerts the detectors opened, which
// come from the alerts table.
const alertType = "alert"

// eventTypes reads the repeatable type parameter of /annotations: the
// event types to keep (checkpoint, overflow, restart, eval, or any type a
// training script recorded). None keeps every type.
func eventTypes(c echo.Context) ([]string, error) {
	types := multiParam(c, "type")
	for _, t := range types {
		if len(t) > api.MaxIDLen {
			return nil, bad("type", "longer than %d bytes", api.MaxIDLen)
		}
		if i := slices.IndexFunc([]rune(t), func(r rune) bool { return !unicode.IsPrint(r) }); i >= 0 {
			return nil, bad("type", "%q holds a control character", t)
		}
	}
	slices.Sort(types)
	return slices.Compact(types), nil
}
