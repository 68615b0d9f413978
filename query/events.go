package query

import (
	"context"
	"fmt"
	"slices"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
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

// eventsOfTypes is store.Events restricted to types in SQL, so a run's
// many events of other types cannot use up the limit before the wanted
// ones are read. The events_dedupe index leads with (run_id, time, type).
func (h *Handler) eventsOfTypes(ctx context.Context, runID string, from, to time.Time, types []string, limit int) ([]store.EventRow, error) {
	rows, err := h.store.Pool.Query(ctx, `SELECT run_id, time, step, rank, type, text FROM events
		WHERE ($1 = '' OR run_id = $1) AND time >= $2 AND time <= $3 AND type = ANY($4)
		ORDER BY time, run_id LIMIT $5`, runID, from, to, types, limit)
	if err != nil {
		return nil, fmt.Errorf("query: events of types %v: %w", types, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.EventRow, error) {
		var e store.EventRow
		err := r.Scan(&e.RunID, &e.Time, &e.Step, &e.Rank, &e.Type, &e.Text)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("query: events of types %v: %w", types, err)
	}
	return out, nil
}
