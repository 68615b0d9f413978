package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Statistics after a bulk load. Ingest can write hundreds of thousands of
// rows a minute, faster than autovacuum's analyze (a pass a minute at
// best, and busy elsewhere) keeps the planner's statistics up: a rollup
// refresh planned for the few rows the statistics still promise ran for
// minutes on a freshly loaded run. The refresher therefore analyzes,
// before its passes, the tables the refresh reads and writes where they
// changed much since their last analyze.

// analyzedTables are the tables whose statistics the refresh's plans
// depend on: the raw rows it reads by rank and block ranges and the
// markers it reads them from. Where they are hypertables, their chunks
// are analyzed.
var analyzedTables = []string{"steps", "layer_times", "rollup_dirty"}

// Staleness: a table is analyzed once this many rows changed since its
// last analyze and they are this fraction of its rows, whichever is more,
// and at most once every analyzeEvery (an ANALYZE of layer_times takes
// seconds on two cores; while a run is loaded it grows by a tenth a pass).
const (
	staleRows     = 20000
	staleFraction = 0.1
	analyzeEvery  = time.Minute
)

// AnalyzeStale runs ANALYZE on each of the tables the rollup refresh
// depends on (or each chunk of them, on TimescaleDB) whose statistics are
// stale, and returns the relations it analyzed.
func (s *Store) AnalyzeStale(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables
		WHERE ((schemaname = current_schema() AND relname = ANY($1))
		       OR (schemaname = '_timescaledb_internal' AND relname LIKE '%chunk'))
		  AND n_mod_since_analyze >= greatest($2::float8, $3::float8 * n_live_tup)
		  AND coalesce(greatest(last_analyze, last_autoanalyze), '-infinity') < now() - $4::interval
		ORDER BY n_mod_since_analyze DESC`, analyzedTables, float64(staleRows), staleFraction, analyzeEvery)
	if err != nil {
		return nil, fmt.Errorf("store: find stale statistics: %w", err)
	}
	rels, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: find stale statistics: %w", err)
	}
	for _, rel := range rels {
		start := time.Now()
		// rel is quoted by format('%I.%I') from the catalog.
		if _, err := s.pool.Exec(ctx, "ANALYZE "+rel); err != nil {
			return nil, fmt.Errorf("store: analyze %s: %w", rel, err)
		}
		s.log.Info("analyzed a table changed in bulk", "table", rel, "took", time.Since(start))
	}
	return rels, nil
}
