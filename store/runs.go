package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
)

// The runs table: reads of runs and their stats, the run record's and end
// record's updates a batch queues, and deleting runs.

// ErrNotFound is returned by reads of a run that does not exist.
var ErrNotFound = errors.New("not found")

// RunRow is a runs row.
type RunRow struct {
	RunID      string
	Project    string
	Name       string
	Status     string
	StartedAt  *time.Time
	EndedAt    *time.Time
	LastSeenAt *time.Time
	Config     json.RawMessage
	Meta       json.RawMessage
	Params     json.RawMessage
	Summary    json.RawMessage
	Tags       []string
	SweepID    string
	LayerNames []string
}

const runCols = `run_id, project, name, status, started_at, ended_at, last_seen_at, config, meta, params, summary, tags, sweep_id, layer_names`

func scanRun(row pgx.Row) (*RunRow, error) {
	var r RunRow
	var cfg, meta, params, summary []byte
	err := row.Scan(&r.RunID, &r.Project, &r.Name, &r.Status, &r.StartedAt, &r.EndedAt, &r.LastSeenAt,
		&cfg, &meta, &params, &summary, &r.Tags, &r.SweepID, &r.LayerNames)
	if err != nil {
		return nil, err
	}
	r.Config, r.Meta, r.Params, r.Summary = cfg, meta, params, summary
	return &r, nil
}

// RunFilter selects runs for ListRuns. Empty fields match everything.
type RunFilter struct {
	Project, Status, Tag, Sweep string
	RunIDs                      []string
	Limit, Offset               int
}

// ListRuns returns the runs matching f, newest first, and how many match
// in all.
func (s *Store) ListRuns(ctx context.Context, f RunFilter) ([]*RunRow, int, error) {
	var where []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(cond, len(args)))
	}
	if f.Project != "" {
		add("project = $%d", f.Project)
	}
	if f.Status != "" {
		add("status = $%d", f.Status)
	}
	if f.Tag != "" {
		add("tags @> ARRAY[$%d::text]", f.Tag)
	}
	if f.Sweep != "" {
		add("sweep_id = $%d", f.Sweep)
	}
	if len(f.RunIDs) > 0 {
		add("run_id = ANY($%d)", f.RunIDs)
	}
	cond := ""
	if len(where) > 0 {
		cond = "WHERE " + strings.Join(where, " AND ")
	}
	var total int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM runs `+cond, args...).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("store: count runs: %w", err)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 1 << 30
	}
	args = append(args, limit, f.Offset)
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT %s FROM runs %s
		ORDER BY coalesce(started_at, created_at) DESC, run_id LIMIT $%d OFFSET $%d`, runCols, cond, len(args)-1, len(args)), args...)
	if err != nil {
		return nil, 0, fmt.Errorf("store: list runs: %w", err)
	}
	defer rows.Close()
	var out []*RunRow
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, 0, fmt.Errorf("store: list runs: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("store: list runs: %w", err)
	}
	return out, total, nil
}

// GetRun returns one run, or ErrNotFound.
func (s *Store) GetRun(ctx context.Context, runID string) (*RunRow, error) {
	r, err := scanRun(s.pool.QueryRow(ctx, `SELECT `+runCols+` FROM runs WHERE run_id = $1`, runID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: get run %s: %w", runID, err)
	}
	return r, nil
}

// RunCode returns the code sent with a run (the JSON of [api.RunCode]),
// nil when none was, or ErrNotFound when there is no such run.
func (s *Store) RunCode(ctx context.Context, runID string) (json.RawMessage, error) {
	var code []byte
	err := s.pool.QueryRow(ctx, `SELECT code FROM runs WHERE run_id = $1`, runID).Scan(&code)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: code of run %s: %w", runID, err)
	}
	return code, nil
}

// RunRanks returns the ranks that recorded steps or layers, ascending.
// It skips through the indexes of the rollups and of the markers of rows
// not rolled up yet, which are small, plain tables: a rank's rows are
// marked in the transaction that writes them and rolled up from the
// markers, so every rank with rows is in one or the other. The steps
// themselves, compressed on TimescaleDB, are not read.
func (s *Store) RunRanks(ctx context.Context, runID string) ([]int, error) {
	return runRanks(ctx, s.pool, runID)
}

// runRanks is [Store.RunRanks] on q (the pool, or a transaction).
func runRanks(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, runID string) ([]int, error) {
	skip := func(name, table string) string {
		return name + ` AS (
			(SELECT rank FROM ` + table + ` WHERE run_id = $1 ORDER BY rank LIMIT 1)
			UNION ALL
			SELECT (SELECT t.rank FROM ` + table + ` t WHERE t.run_id = $1 AND t.rank > ` + name + `.rank ORDER BY t.rank LIMIT 1)
			FROM ` + name + ` WHERE ` + name + `.rank IS NOT NULL
		)`
	}
	rows, err := q.Query(ctx, `WITH RECURSIVE `+skip("m", "metric_rollup_rows")+`, `+skip("s", "metric_rollup_sets")+`,
		`+skip("l", "layer_rollups")+`, `+skip("d", "rollup_dirty")+`
		SELECT rank FROM m WHERE rank IS NOT NULL UNION SELECT rank FROM s WHERE rank IS NOT NULL
		UNION SELECT rank FROM l WHERE rank IS NOT NULL UNION SELECT rank FROM d WHERE rank IS NOT NULL ORDER BY 1`, runID)
	if err != nil {
		return nil, fmt.Errorf("store: ranks of %s: %w", runID, err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

// RankHosts returns the host of each rank: the host of its newest GPU
// sample attributed to the run (rank_hosts, kept by ingest).
func (s *Store) RankHosts(ctx context.Context, runID string) (map[int]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT rank, host FROM rank_hosts WHERE run_id = $1`, runID)
	if err != nil {
		return nil, fmt.Errorf("store: hosts of %s: %w", runID, err)
	}
	defer rows.Close()
	out := map[int]string{}
	for rows.Next() {
		var r int
		var h string
		if err := rows.Scan(&r, &h); err != nil {
			return nil, fmt.Errorf("store: hosts of %s: %w", runID, err)
		}
		out[r] = h
	}
	return out, rows.Err()
}

type runUpdate struct {
	project, name, sweepID *string
	startedAt              *time.Time
	config, params, tags   *string
	code                   *string
	meta                   map[string]json.RawMessage
}

// run folds a run record into the batch's update of that run, so that
// several records for one run in a batch apply in order.
func (b *batchPlan) run(r *api.Run) {
	t := b.now
	if r.StartedAt != nil && !r.StartedAt.IsZero() {
		t = r.StartedAt.Time
	}
	b.seen(r.RunID, t)
	u := b.runs[r.RunID]
	if u == nil {
		u = &runUpdate{}
		b.runs[r.RunID] = u
	}
	if r.Project != "" {
		u.project = &r.Project
	}
	if r.Name != "" {
		u.name = &r.Name
	}
	if r.SweepID != "" {
		u.sweepID = &r.SweepID
	}
	if r.StartedAt != nil && !r.StartedAt.IsZero() {
		st := r.StartedAt.Time
		u.startedAt = &st
	}
	if js := rawObject(r.Config); js != nil {
		u.config = js
	}
	if js := rawObject(r.Params); js != nil {
		u.params = js
	}
	if r.Code != nil {
		if js, err := json.Marshal(r.Code); err == nil {
			s := string(js)
			u.code = &s
		}
	}
	if r.Tags != nil {
		js, _ := json.Marshal(r.Tags)
		s := string(js)
		u.tags = &s
	}
	if r.Meta != nil {
		js, err := json.Marshal(r.Meta)
		var m map[string]json.RawMessage
		if err == nil && json.Unmarshal(js, &m) == nil {
			if u.meta == nil {
				u.meta = map[string]json.RawMessage{}
			}
			for k, v := range m {
				u.meta[k] = v
			}
		}
	}
}

func rawObject(raw json.RawMessage) *string {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	s := string(raw)
	return &s
}

// RunStartedAt returns the stored start of a run, and whether the run
// exists with a start.
func (s *Store) RunStartedAt(ctx context.Context, runID string) (time.Time, bool, error) {
	var t *time.Time
	err := s.pool.QueryRow(ctx, `SELECT started_at FROM runs WHERE run_id = $1`, runID).Scan(&t)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("store: read run %s: %w", runID, err)
	}
	if t == nil {
		return time.Time{}, false, nil
	}
	return t.UTC(), true, nil
}

// RunProject returns the project run runID is stored in; found is false
// when there is no such run.
func (s *Store) RunProject(ctx context.Context, runID string) (project string, found bool, err error) {
	err = s.pool.QueryRow(ctx, `SELECT project FROM runs WHERE run_id = $1`, runID).Scan(&project)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("store: read run %s: %w", runID, err)
	}
	return project, true, nil
}

// DeleteRuns removes runs and every row that belongs to them. Load tools
// use it to clear their scratch runs.
func (s *Store) DeleteRuns(ctx context.Context, runIDs []string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The runs' locks, which batches hold shared, then the rollup
		// refresher's, each in key order: a refresh of one of these runs
		// deletes its markers and writes its rollups, the other way round
		// from here, and the two would deadlock.
		keys := make([]int64, len(runIDs))
		for i, id := range runIDs {
			keys[i] = runLockKey(id)
		}
		// A wide batch takes none of its runs' locks (batch_locks.go).
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared($1)`, wideBatchLock); err != nil {
			return fmt.Errorf("store: delete runs: lock batches: %w", err)
		}
		if _, err := tx.Exec(ctx, `SELECT count(pg_advisory_xact_lock(k)) FROM
			(SELECT DISTINCT k FROM unnest($1::bigint[]) AS k ORDER BY 1) AS l`, keys); err != nil {
			return fmt.Errorf("store: delete runs: lock runs: %w", err)
		}
		if _, err := tx.Exec(ctx, `SELECT count(pg_advisory_xact_lock(k)) FROM
			(SELECT DISTINCT `+refreshLockKey("r")+` AS k FROM unnest($1::text[]) AS r ORDER BY 1) AS l`, runIDs); err != nil {
			return fmt.Errorf("store: delete runs: lock rollups: %w", err)
		}
		for _, t := range []string{"steps", "layer_times", "evals", "memory_breakdowns", "events", "gpu_minutes", "rank_hosts", "rollup_dirty", "metric_rollup_rows", "metric_rollup_sets", "metric_spread", "layer_rollups", "rank_score_heads", "rank_score_spans", "run_summaries", "runs"} {
			if _, err := tx.Exec(ctx, `DELETE FROM `+t+` WHERE run_id = ANY($1)`, runIDs); err != nil {
				return fmt.Errorf("store: delete runs from %s: %w", t, err)
			}
		}
		return nil
	})
}

// runUpdates queues the batch's writes to the runs table: the times its
// records move, then its run records, then its end records.
func (b *batchPlan) runUpdates(q *pgx.Batch) int {
	n := 0
	if len(b.runIDs) > 0 {
		first := make([]time.Time, len(b.runIDs))
		last := make([]time.Time, len(b.runIDs))
		for i, id := range b.runIDs {
			first[i], last[i] = b.runFirst[id], b.runLast[id]
		}
		q.Queue(`UPDATE runs AS r SET
				started_at = LEAST(r.started_at, u.first),
				last_seen_at = GREATEST(r.last_seen_at, u.last),
				updated_at = now()
			FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[]) AS u(run_id, first, last)
			WHERE r.run_id = u.run_id
			  AND (r.started_at IS NULL OR u.first < r.started_at
			       OR r.last_seen_at IS NULL OR u.last >= r.last_seen_at + interval '1 second'
			       OR r.updated_at < now() - interval '10 seconds')`,
			b.runIDs, first, last)
		n++
	}
	if len(b.runs) > 0 {
		var (
			ids                                        []string
			project, name, sweep, config, params, tags []*string
			meta, code                                 []*string
			started                                    []*time.Time
		)
		for id, u := range b.runs {
			ids = append(ids, id)
			project = append(project, u.project)
			name = append(name, u.name)
			sweep = append(sweep, u.sweepID)
			config = append(config, u.config)
			params = append(params, u.params)
			tags = append(tags, u.tags)
			code = append(code, u.code)
			started = append(started, u.startedAt)
			var m *string
			if u.meta != nil {
				js, _ := json.Marshal(u.meta)
				s := string(js)
				m = &s
			}
			meta = append(meta, m)
		}
		q.Queue(`UPDATE runs AS r SET
				project    = COALESCE(u.project, r.project),
				name       = COALESCE(u.name, r.name),
				sweep_id   = COALESCE(u.sweep_id, r.sweep_id),
				started_at = COALESCE(u.started_at, r.started_at),
				config     = COALESCE(u.config::jsonb, r.config),
				params     = COALESCE(u.params::jsonb, r.params),
				code       = COALESCE(u.code::jsonb, r.code),
				meta       = r.meta || COALESCE(u.meta::jsonb, '{}'),
				tags       = CASE WHEN u.tags IS NULL THEN r.tags
				                  ELSE ARRAY(SELECT jsonb_array_elements_text(u.tags::jsonb)) END,
				updated_at = now()
			FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[],
			            $6::text[], $7::text[], $8::text[], $9::text[], $10::text[])
			     AS u(run_id, project, name, sweep_id, started_at, config, params, meta, tags, code)
			WHERE r.run_id = u.run_id`,
			ids, project, name, sweep, started, config, params, meta, tags, code)
		n++
	}
	if len(b.ends) > 0 {
		var (
			ids, status []string
			at          []time.Time
			summary     []*string
		)
		for id, e := range b.ends {
			ids = append(ids, id)
			status = append(status, e.Status)
			at = append(at, e.Time.Time)
			summary = append(summary, rawObject(e.Summary))
		}
		q.Queue(`UPDATE runs AS r SET
				status = u.status,
				ended_at = u.ended_at,
				summary = r.summary || COALESCE(u.summary::jsonb, '{}'),
				updated_at = now()
			FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[]) AS u(run_id, status, ended_at, summary)
			WHERE r.run_id = u.run_id`, ids, status, at, summary)
		n++
	}
	return n
}
