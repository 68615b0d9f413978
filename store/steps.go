package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// RecentStep is a step row as the detectors read it.
type RecentStep struct {
	Rank       int
	Step       int64
	Time       time.Time
	Loss       *float64
	GradNorm   *float64
	LossScale  *float64
	Skipped    bool
	StepMS     *float64
	DataMS     *float64
	SyncNS     *int64
	SyncWaitMS *float64
}

// RecentSteps reads each rank's newest n steps, by rank and newest first.
// Each rank's rows come from a backward scan of the steps' unique index: a
// bounded read however long the run.
func (s *Store) RecentSteps(ctx context.Context, runID string, ranks []int, n int) ([]RecentStep, error) {
	rk := make([]int32, len(ranks))
	for i, r := range ranks {
		rk[i] = int32(r)
	}
	rows, err := s.pool.Query(ctx, `
		SELECT rk.rank, x.step, x.time, x.loss, x.grad_norm, x.loss_scale, coalesce(x.skipped, false), x.step_ms, x.data_ms,
			x.sync_ns, x.sync_wait_ms
		FROM unnest($3::int[]) AS rk(rank), LATERAL (SELECT step, time, loss, grad_norm, loss_scale, skipped, step_ms, data_ms, sync_ns, sync_wait_ms FROM steps
			WHERE run_id = $1 AND rank = rk.rank ORDER BY step DESC, time DESC LIMIT $2) x
		ORDER BY rk.rank, x.step DESC`, runID, n, rk)
	if err != nil {
		return nil, fmt.Errorf("store: recent steps of %s: %w", runID, err)
	}
	defer rows.Close()
	var out []RecentStep
	for rows.Next() {
		var s RecentStep
		if err := rows.Scan(&s.Rank, &s.Step, &s.Time, &s.Loss, &s.GradNorm, &s.LossScale, &s.Skipped, &s.StepMS, &s.DataMS, &s.SyncNS, &s.SyncWaitMS); err != nil {
			return nil, fmt.Errorf("store: recent steps of %s: %w", runID, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: recent steps of %s: %w", runID, err)
	}
	return out, nil
}

// SyncSteps reads every rank's steps in [from, to] with the fields the
// straggler score needs (Step, Time, StepMS, SyncNS, SyncWaitMS), by rank
// and newest first. It reads every rank's rows of the range: the caller
// bounds ranks × steps.
func (s *Store) SyncSteps(ctx context.Context, runID string, ranks []int, from, to int64) ([]RecentStep, error) {
	rk := make([]int32, len(ranks))
	for i, r := range ranks {
		rk[i] = int32(r)
	}
	rows, err := s.pool.Query(ctx, `
		SELECT rk.rank, x.step, x.time, x.step_ms, x.sync_ns, x.sync_wait_ms
		FROM unnest($4::int[]) AS rk(rank), LATERAL (SELECT step, time, step_ms, sync_ns, sync_wait_ms FROM steps
			WHERE run_id = $1 AND rank = rk.rank AND step >= $2 AND step <= $3 ORDER BY step DESC, time DESC) x
		ORDER BY rk.rank, x.step DESC`, runID, from, to, rk)
	if err != nil {
		return nil, fmt.Errorf("store: sync steps of %s: %w", runID, err)
	}
	defer rows.Close()
	var out []RecentStep
	for rows.Next() {
		var s RecentStep
		if err := rows.Scan(&s.Rank, &s.Step, &s.Time, &s.StepMS, &s.SyncNS, &s.SyncWaitMS); err != nil {
			return nil, fmt.Errorf("store: sync steps of %s: %w", runID, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: sync steps of %s: %w", runID, err)
	}
	return out, nil
}

// StepNear returns the first recorded step of the run's rank at or after s
// (after true), or the last one at or before s, with its time; found is
// false when there is none.
func (s *Store) StepNear(ctx context.Context, runID string, rank int, step int64, after bool) (at int64, t time.Time, found bool, err error) {
	sql := `SELECT step, time FROM steps WHERE run_id = $1 AND rank = $2 AND step >= $3 ORDER BY step LIMIT 1`
	if !after {
		sql = `SELECT step, time FROM steps WHERE run_id = $1 AND rank = $2 AND step <= $3 ORDER BY step DESC LIMIT 1`
	}
	err = s.pool.QueryRow(ctx, sql, runID, rank, step).Scan(&at, &t)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, time.Time{}, false, nil
	}
	if err != nil {
		return 0, time.Time{}, false, fmt.Errorf("store: step near %d of %s rank %d: %w", step, runID, rank, err)
	}
	return at, t, true, nil
}

// StepCopies returns how many rows each step of the run has, counted per
// rank and step; a step several ranks hold shows one rank's count. Load
// tools use it to check that what was acknowledged is stored once.
func (s *Store) StepCopies(ctx context.Context, runID string) (map[int64]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT step, count(*) FROM steps WHERE run_id = $1 GROUP BY rank, step`, runID)
	if err != nil {
		return nil, fmt.Errorf("store: step copies of %s: %w", runID, err)
	}
	defer rows.Close()
	out := map[int64]int{}
	for rows.Next() {
		var step int64
		var n int
		if err := rows.Scan(&step, &n); err != nil {
			return nil, fmt.Errorf("store: step copies of %s: %w", runID, err)
		}
		out[step] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: step copies of %s: %w", runID, err)
	}
	return out, nil
}

// CountStepRows counts the run's rows in steps (layers false) or in
// layer_times (layers true), and how many of them repeat a (rank, step)
// key: the rows beyond the first of each key. Load tools use it.
func (s *Store) CountStepRows(ctx context.Context, runID string, layers bool) (rows, repeated int64, err error) {
	q := `SELECT count(*), count(*) - count(DISTINCT (rank, step)) FROM steps WHERE run_id = $1`
	if layers {
		q = `SELECT count(*), count(*) - count(DISTINCT (rank, step)) FROM layer_times WHERE run_id = $1`
	}
	if err := s.pool.QueryRow(ctx, q, runID).Scan(&rows, &repeated); err != nil {
		return 0, 0, fmt.Errorf("store: count rows of %s: %w", runID, err)
	}
	return rows, repeated, nil
}
