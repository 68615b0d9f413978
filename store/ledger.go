package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// StepTimeSpan returns the time of one rank's first and last step, from
// its whole-run rollup (refresh the run's rollups first); found false
// when it has none.
func (s *Store) StepTimeSpan(ctx context.Context, runID string, rank int) (first, last time.Time, found bool, err error) {
	var lt *time.Time
	err = s.pool.QueryRow(ctx, `SELECT first_time, last_time FROM metric_rollup_rows
		WHERE run_id = $1 AND rank = $2 AND width = $3 AND bucket = 0 AND metric = 'step'`, runID, rank, TotalWidth).Scan(&first, &lt)
	if errors.Is(err, pgx.ErrNoRows) {
		return first, last, false, nil
	}
	if err != nil {
		return first, last, false, fmt.Errorf("store: step span of %s: %w", runID, err)
	}
	last = first
	if lt != nil {
		last = *lt
	}
	return first, last, true, nil
}
