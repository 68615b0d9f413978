package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
)

// The events table: a run's events, with or without a time.

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

var (
	eventCols = []string{"run_id", "time", "step", "rank", "type", "text"}
)

func (b *batchPlan) eventRow(i int, r []any) []any { return eventRow(b.events[i], r) }

func (b *batchPlan) untimedRow(i int, r []any) []any { return eventRow(b.untimed[i], r) }

func eventRow(e *api.Event, r []any) []any {
	step, rank := int64(-1), int32(-1)
	if e.Step != nil {
		step = *e.Step
	}
	if e.Rank != nil {
		rank = int32(*e.Rank)
	}
	return append(r, e.RunID, e.Time.Time, step, rank, e.Type, e.Text)
}

const (
	mergeEvents = `INSERT INTO events SELECT * FROM tmp_events ORDER BY run_id, time, type, step, rank ON CONFLICT DO NOTHING`
)

// mergeUntimedEvents inserts the events sent without a time that the run
// does not already hold with the same rank, step, type and text.
const mergeUntimedEvents = `INSERT INTO events
	SELECT s.* FROM (SELECT DISTINCT ON (run_id, rank, step, type, text) * FROM tmp_untimed_events
		ORDER BY run_id, rank, step, type, text, time) AS s
	WHERE NOT EXISTS (SELECT 1 FROM events AS t
		WHERE t.run_id = s.run_id AND t.rank = s.rank AND t.step = s.step AND t.type = s.type AND t.text = s.text)
	ORDER BY s.run_id, s.time, s.type, s.step, s.rank
	ON CONFLICT DO NOTHING`

// EventRow is one event of a run.
type EventRow struct {
	RunID string
	Time  time.Time
	Step  int64 // -1 when absent
	Rank  int   // -1 when absent
	Type  string
	Text  string
}

// Events returns the events of runID (empty: every run) in [from, to],
// oldest first, at most limit of them.
func (s *Store) Events(ctx context.Context, runID string, from, to time.Time, limit int) ([]EventRow, error) {
	rows, err := s.pool.Query(ctx, `SELECT run_id, time, step, rank, type, text FROM events
		WHERE ($1 = '' OR run_id = $1) AND time >= $2 AND time <= $3 ORDER BY time, run_id LIMIT $4`, runID, from, to, limit)
	if err != nil {
		return nil, fmt.Errorf("store: events: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (EventRow, error) {
		var e EventRow
		err := r.Scan(&e.RunID, &e.Time, &e.Step, &e.Rank, &e.Type, &e.Text)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: events: %w", err)
	}
	return out, nil
}
