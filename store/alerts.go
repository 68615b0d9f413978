package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/detect"
)

// The alerts table: what the detectors of package alerts
// read and write, and what the alert endpoints and /metrics show.

// CandidateRecent is how long after the server last received records for a
// run the detectors keep visiting it, whatever its status and the times
// its records carry.
const CandidateRecent = time.Hour

// AlertCandidate is a run the detectors look at in a pass.
type AlertCandidate struct {
	RunID   string
	Running bool
	Meta    []byte // the run's meta, JSON
}

// AlertCandidates returns the runs a pass of the detectors visits, at most
// limit: the running ones seen in the last day, those with open alerts, and
// those the server received records for in the last CandidateRecent
// whatever their records' times (a recorded run sent after the fact: its
// steps and hang reports are old, its status often finished), the most
// recently received first.
func (s *Store) AlertCandidates(ctx context.Context, limit int) ([]AlertCandidate, error) {
	rows, err := s.pool.Query(ctx, `SELECT run_id, status = 'running', meta FROM runs
		WHERE (status = 'running' AND last_seen_at > now() - interval '1 day')
		   OR updated_at > now() - $2::interval
		   OR run_id IN (SELECT run_id FROM alerts WHERE resolved_at IS NULL)
		ORDER BY updated_at DESC, last_seen_at DESC NULLS LAST LIMIT $1`, limit, CandidateRecent)
	if err != nil {
		return nil, fmt.Errorf("store: alert candidates: %w", err)
	}
	runs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AlertCandidate, error) {
		var c AlertCandidate
		err := r.Scan(&c.RunID, &c.Running, &c.Meta)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: alert candidates: %w", err)
	}
	return runs, nil
}

// WithSessionLock runs fn while this server holds the session advisory
// lock key, and reports whether it got it: false (and fn not run) when
// another session holds it. The lock is released when fn returns, or the
// session closed when it cannot be.
func (s *Store) WithSessionLock(ctx context.Context, key int64, fn func(ctx context.Context) error) (bool, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("store: acquire connection: %w", err)
	}
	defer conn.Release()
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&got); err != nil {
		return false, fmt.Errorf("store: take lock: %w", err)
	}
	if !got {
		return false, nil
	}
	defer func() {
		// A fresh context: the caller's may be done, the lock must go.
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
			conn.Conn().Close(uctx) // closing the session drops the lock
		}
	}()
	return true, fn(ctx)
}

// ReconcileAlerts makes the run's open alerts what fires: a new firing
// opens an alert, one already open is updated in place (the partial unique
// index keeps it single), and an open alert that no longer fires is
// resolved.
func (s *Store) ReconcileAlerts(ctx context.Context, runID string, fs []detect.Firing) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("store: reconcile alerts of %s: %w", runID, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	kinds := make([]string, len(fs))
	subjects := make([]string, len(fs))
	for i, f := range fs {
		kinds[i], subjects[i] = f.Kind, f.Subject
		if _, err := tx.Exec(ctx, `INSERT INTO alerts (run_id, kind, subject, rank, step, value, threshold, text, at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
			ON CONFLICT (run_id, kind, subject) WHERE resolved_at IS NULL
			DO UPDATE SET value = EXCLUDED.value, updated_at = now()`,
			runID, f.Kind, f.Subject, f.Rank, f.Step, f.Value, f.Threshold, f.Text, f.At); err != nil {
			return fmt.Errorf("store: open alert %s on %s: %w", f.Kind, runID, err)
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE alerts SET resolved_at = now(), updated_at = now()
		WHERE run_id = $1 AND resolved_at IS NULL
		  AND (kind, subject) NOT IN (SELECT * FROM unnest($2::text[], $3::text[]))`, runID, kinds, subjects); err != nil {
		return fmt.Errorf("store: resolve alerts on %s: %w", runID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("store: reconcile alerts of %s: %w", runID, err)
	}
	return nil
}

// AlertFilter selects alerts for [Store.Alerts]; empty fields select all.
type AlertFilter struct {
	Project string
	RunID   string
	State   string // "", "open" or "resolved"
	Kind    string
	Limit   int
}

// Alerts returns alerts matching f, the newest opened first (at most 100
// when f.Limit is not set).
func (s *Store) Alerts(ctx context.Context, f AlertFilter) ([]api.Alert, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := s.pool.Query(ctx, `SELECT a.id, a.run_id, coalesce(r.project, ''), a.kind, a.subject, a.rank, a.step,
			a.value, a.threshold, a.text, a.at, a.opened_at, a.resolved_at
		FROM alerts a LEFT JOIN runs r USING (run_id)
		WHERE ($1 = '' OR r.project = $1) AND ($2 = '' OR a.run_id = $2) AND ($3 = '' OR a.kind = $3)
		  AND ($4 = '' OR ($4 = 'open') = (a.resolved_at IS NULL))
		ORDER BY a.opened_at DESC, a.id DESC LIMIT $5`, f.Project, f.RunID, f.Kind, f.State, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("store: list alerts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.Alert, error) {
		var a api.Alert
		var v, th *float64
		err := r.Scan(&a.ID, &a.RunID, &a.Project, &a.Kind, &a.Subject, &a.Rank, &a.Step, &v, &th, &a.Text, &a.At, &a.OpenedAt, &a.ResolvedAt)
		a.Value, a.Threshold = apiFloat(v), apiFloat(th)
		a.State = "open"
		if a.ResolvedAt != nil {
			a.State = "resolved"
		}
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: list alerts: %w", err)
	}
	if out == nil {
		out = []api.Alert{}
	}
	return out, nil
}

func apiFloat(p *float64) *api.Float {
	if p == nil {
		return nil
	}
	f := api.Float(*p)
	return &f
}

// OpenAlertCount returns how many alerts of a run are open.
func (s *Store) OpenAlertCount(ctx context.Context, runID string) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM alerts WHERE run_id = $1 AND resolved_at IS NULL`, runID).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count open alerts of %s: %w", runID, err)
	}
	return n, nil
}

// AlertAnnotation is an alert as the annotations endpoint shows it.
type AlertAnnotation struct {
	RunID      string
	Kind       string
	Rank       *int
	Step       *int64
	Text       string
	At         time.Time
	ResolvedAt *time.Time
}

// AlertAnnotations returns the alerts of a run (all runs when runID is "")
// that opened on data between from and to, at most limit.
func (s *Store) AlertAnnotations(ctx context.Context, runID string, from, to time.Time, limit int) ([]AlertAnnotation, error) {
	rows, err := s.pool.Query(ctx, `SELECT run_id, kind, rank, step, text, at, resolved_at FROM alerts
		WHERE ($1 = '' OR run_id = $1) AND at >= $2 AND at <= $3 ORDER BY at, id LIMIT $4`, runID, from, to, limit)
	if err != nil {
		return nil, fmt.Errorf("store: alert annotations: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AlertAnnotation, error) {
		var a AlertAnnotation
		err := r.Scan(&a.RunID, &a.Kind, &a.Rank, &a.Step, &a.Text, &a.At, &a.ResolvedAt)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: alert annotations: %w", err)
	}
	return out, nil
}

// AlertKindCount is how many alerts of one kind are open and stored.
type AlertKindCount struct {
	Kind        string
	Open, Total float64
}

// AlertCounts returns the alerts open and stored, by kind: a small
// aggregate over the alerts table, read at each scrape of /metrics.
func (s *Store) AlertCounts(ctx context.Context) ([]AlertKindCount, error) {
	rows, err := s.pool.Query(ctx, `SELECT kind, count(*) FILTER (WHERE resolved_at IS NULL), count(*) FROM alerts GROUP BY kind`)
	if err != nil {
		return nil, fmt.Errorf("store: count alerts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AlertKindCount, error) {
		var c AlertKindCount
		err := r.Scan(&c.Kind, &c.Open, &c.Total)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: count alerts: %w", err)
	}
	return out, nil
}

// OpenAlert names one open alert: its run, project, kind and subject.
type OpenAlert struct {
	RunID, Project, Kind, Subject string
}

// OpenAlerts returns the open alerts, at most limit, in order of run, kind
// and subject.
func (s *Store) OpenAlerts(ctx context.Context, limit int) ([]OpenAlert, error) {
	rows, err := s.pool.Query(ctx, `SELECT a.run_id, coalesce(r.project, ''), a.kind, a.subject FROM alerts a
		LEFT JOIN runs r USING (run_id) WHERE a.resolved_at IS NULL ORDER BY a.run_id, a.kind, a.subject LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("store: open alerts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OpenAlert, error) {
		var a OpenAlert
		err := r.Scan(&a.RunID, &a.Project, &a.Kind, &a.Subject)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: open alerts: %w", err)
	}
	return out, nil
}
