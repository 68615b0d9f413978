package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// NewestEvents returns each rank's newest event of type typ of the run
// later than after, in rank order; events of no rank are left out.
func (s *Store) NewestEvents(ctx context.Context, runID, typ string, after time.Time) ([]EventRow, error) {
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT ON (rank) run_id, time, step, rank, type, text FROM events
		WHERE run_id = $1 AND type = $2 AND time > $3 AND rank >= 0 ORDER BY rank, time DESC`, runID, typ, after)
	if err != nil {
		return nil, fmt.Errorf("store: %s events of %s: %w", typ, runID, err)
	}
	out, err := pgx.CollectRows(rows, scanEvent)
	if err != nil {
		return nil, fmt.Errorf("store: %s events of %s: %w", typ, runID, err)
	}
	return out, nil
}

// EventsOfTypes is [Store.Events] restricted to types in SQL, so a run's
// many events of other types cannot use up the limit before the wanted
// ones are read. The events_dedupe index leads with (run_id, time, type).
func (s *Store) EventsOfTypes(ctx context.Context, runID string, from, to time.Time, types []string, limit int) ([]EventRow, error) {
	rows, err := s.pool.Query(ctx, `SELECT run_id, time, step, rank, type, text FROM events
		WHERE ($1 = '' OR run_id = $1) AND time >= $2 AND time <= $3 AND type = ANY($4)
		ORDER BY time, run_id LIMIT $5`, runID, from, to, types, limit)
	if err != nil {
		return nil, fmt.Errorf("store: events of types %v: %w", types, err)
	}
	out, err := pgx.CollectRows(rows, scanEvent)
	if err != nil {
		return nil, fmt.Errorf("store: events of types %v: %w", types, err)
	}
	return out, nil
}

func scanEvent(r pgx.CollectableRow) (EventRow, error) {
	var e EventRow
	err := r.Scan(&e.RunID, &e.Time, &e.Step, &e.Rank, &e.Type, &e.Text)
	return e, err
}
