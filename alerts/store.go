package alerts

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// reconcile makes the run's open alerts what fires: a new firing opens an
// alert, one already open is updated in place (the partial unique index
// keeps it single), and an open alert that no longer fires is resolved.
func reconcile(ctx context.Context, q querier, runID string, fs []firing) error {
	tx, err := q.Begin(ctx)
	if err != nil {
		return fmt.Errorf("alerts: reconcile %s: %w", runID, err)
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
			return fmt.Errorf("alerts: open %s on %s: %w", f.Kind, runID, err)
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE alerts SET resolved_at = now(), updated_at = now()
		WHERE run_id = $1 AND resolved_at IS NULL
		  AND (kind, subject) NOT IN (SELECT * FROM unnest($2::text[], $3::text[]))`, runID, kinds, subjects); err != nil {
		return fmt.Errorf("alerts: resolve on %s: %w", runID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("alerts: reconcile %s: %w", runID, err)
	}
	return nil
}

// Filter selects alerts for List; empty fields select all.
type Filter struct {
	Project string
	RunID   string
	State   string // "", "open" or "resolved"
	Kind    string
	Limit   int
}

// List returns alerts matching f, the newest opened first.
func List(ctx context.Context, st *store.Store, f Filter) ([]api.Alert, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := st.Pool.Query(ctx, `SELECT a.id, a.run_id, coalesce(r.project, ''), a.kind, a.subject, a.rank, a.step,
			a.value, a.threshold, a.text, a.at, a.opened_at, a.resolved_at
		FROM alerts a LEFT JOIN runs r USING (run_id)
		WHERE ($1 = '' OR r.project = $1) AND ($2 = '' OR a.run_id = $2) AND ($3 = '' OR a.kind = $3)
		  AND ($4 = '' OR ($4 = 'open') = (a.resolved_at IS NULL))
		ORDER BY a.opened_at DESC, a.id DESC LIMIT $5`, f.Project, f.RunID, f.Kind, f.State, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("alerts: list: %w", err)
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
		return nil, fmt.Errorf("alerts: list: %w", err)
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

// OpenCount returns how many alerts of a run are open.
func OpenCount(ctx context.Context, st *store.Store, runID string) (int64, error) {
	var n int64
	if err := st.Pool.QueryRow(ctx, `SELECT count(*) FROM alerts WHERE run_id = $1 AND resolved_at IS NULL`, runID).Scan(&n); err != nil {
		return 0, fmt.Errorf("alerts: count open of %s: %w", runID, err)
	}
	return n, nil
}

// Annotation is an alert as the annotations endpoint shows it.
type Annotation struct {
	RunID      string
	Kind       string
	Rank       *int
	Step       *int64
	Text       string
	At         time.Time
	ResolvedAt *time.Time
}

// Annotations returns the alerts of a run (all runs when runID is "")
// that opened on data between from and to.
func Annotations(ctx context.Context, st *store.Store, runID string, from, to time.Time, limit int) ([]Annotation, error) {
	rows, err := st.Pool.Query(ctx, `SELECT run_id, kind, rank, step, text, at, resolved_at FROM alerts
		WHERE ($1 = '' OR run_id = $1) AND at >= $2 AND at <= $3 ORDER BY at, id LIMIT $4`, runID, from, to, limit)
	if err != nil {
		return nil, fmt.Errorf("alerts: annotations: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Annotation, error) {
		var a Annotation
		err := r.Scan(&a.RunID, &a.Kind, &a.Rank, &a.Step, &a.Text, &a.At, &a.ResolvedAt)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("alerts: annotations: %w", err)
	}
	return out, nil
}
