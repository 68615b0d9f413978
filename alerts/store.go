package alerts

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/alerts/detect"
	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// reconcile makes the run's open alerts what fires: a new firing opens an
// alert, one already open is updated in place (the partial unique index
// keeps it single), and an open alert that no longer fires is resolved.
func reconcile(ctx context.Context, q querier, runID string, fs []detect.Firing) error {
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

// scoreRanks scores the steps every rank reported among the newest ones,
// continuing each rank's EWMA from the last stored score when that step
// is still among them, stores the new scores in rank_scores and returns
// each rank's newest score and how many steps were scored to get it.
func scoreRanks(ctx context.Context, q querier, runID string, byRank map[int][]detect.StepRow, cfg detect.Config) (map[int]detect.RankScore, int, error) {
	steps := detect.SyncSteps(byRank, cfg.Window)
	rows, err := q.Query(ctx, `SELECT rank, step, time, lateness_ms, busy_ms, wait_ms, score FROM rank_scores
		WHERE run_id = $1 AND step = (SELECT max(step) FROM rank_scores WHERE run_id = $1)`, runID)
	if err != nil {
		return nil, 0, fmt.Errorf("alerts: last scores of %s: %w", runID, err)
	}
	last := map[int]detect.RankScore{}
	for rows.Next() {
		var s detect.RankScore
		var late, busy, wait *float64
		if err := rows.Scan(&s.Rank, &s.Step, &s.Time, &late, &busy, &wait, &s.Score); err != nil {
			rows.Close()
			return nil, 0, fmt.Errorf("alerts: last scores of %s: %w", runID, err)
		}
		s.Late, s.Busy, s.Wait = orNaN(late), orNaN(busy), orNaN(wait)
		last[s.Rank] = s
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("alerts: last scores of %s: %w", runID, err)
	}
	var lastStep int64 = -1
	prev := map[int]float64{}
	for r, s := range last {
		lastStep = s.Step
		prev[r] = s.Score
	}
	// Continue the stored series only when its step is in the window;
	// otherwise the evaluator fell behind (or restarted) and starts over.
	cont := len(last) > 0 && len(steps) > 0 && steps[0].Step <= lastStep
	scored := len(steps)
	if cont {
		i := slices.IndexFunc(steps, func(x detect.SyncStep) bool { return x.Step > lastStep })
		if i < 0 {
			steps = nil
		} else {
			steps = steps[i:]
		}
		scored = detect.MinScored // a stored series was scored before
	} else {
		prev = nil
		if len(steps) < detect.MinScored {
			return nil, 0, nil // a series starts with enough steps to fire on
		}
	}
	fresh := detect.StragglerScores(steps, cfg.StragglerAlpha, prev)
	newest := map[int]detect.RankScore{}
	if cont {
		for r, s := range last {
			newest[r] = s
		}
	}
	for _, s := range fresh {
		newest[s.Rank] = s
	}
	if len(fresh) == 0 {
		if !cont {
			return nil, 0, nil
		}
		return newest, scored, nil
	}
	n := len(fresh)
	ranks, stepsCol, times := make([]int32, n), make([]int64, n), make([]time.Time, n)
	late, busy, wait, score := make([]*float64, n), make([]*float64, n), make([]*float64, n), make([]float64, n)
	for i, s := range fresh {
		ranks[i], stepsCol[i], times[i], score[i] = int32(s.Rank), s.Step, s.Time, s.Score
		late[i], busy[i], wait[i] = nanNil(s.Late), nanNil(s.Busy), nanNil(s.Wait)
	}
	tx, err := q.Begin(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("alerts: store scores of %s: %w", runID, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.Exec(ctx, `INSERT INTO rank_scores (run_id, rank, step, time, lateness_ms, busy_ms, wait_ms, score)
		SELECT $1, * FROM unnest($2::int4[], $3::int8[], $4::timestamptz[], $5::float8[], $6::float8[], $7::float8[], $8::float8[])
		ON CONFLICT (run_id, rank, step) DO NOTHING`, runID, ranks, stepsCol, times, late, busy, wait, score); err != nil {
		return nil, 0, fmt.Errorf("alerts: store scores of %s: %w", runID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, 0, fmt.Errorf("alerts: store scores of %s: %w", runID, err)
	}
	return newest, scored, nil
}

func orNaN(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

func nanNil(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}
