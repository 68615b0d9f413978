package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Dead rows of the derived tables. The rollup refresh deletes and writes
// afresh every bucket it recomputes (a rank's width-1,000 and 10,000
// buckets and its whole-run row again for each chunk of blocks under
// them), ingest updates a GPU's minute row with each batch of its
// samples, and a refreshed block's marker is deleted: on a bulk load of a
// thousand ranks these tables turn over faster than autovacuum gets to
// them (one worker a table, once a fifth of it is dead, a minute apart at
// best). After the 1,024 × 2,000 load of deepseed bench query on plain
// PostgreSQL, metric_rollups held 295 k dead rows beside 737 k live ones,
// gpu_device_minutes 93 k beside 36 k, rollup_dirty 98 k and none live.
// The refresher therefore vacuums, before its passes, the tables it and
// ingest rewrite where their dead rows pile up, so that their space is
// taken again (docs/scale.md).

// churnedTables are the tables rewritten in place as data arrives; none is
// a hypertable.
var churnedTables = []string{"metric_rollups", "layer_rollups", "metric_spread", "gpu_device_minutes", "gpu_minutes",
	"host_minutes", "rank_score_heads", "run_summaries", "rollup_dirty"}

// A table is vacuumed once it holds this many dead rows and they are this
// fraction of its live ones, whichever is more, and at most once every
// vacuumEvery.
const (
	deadRows     = 20000
	deadFraction = 0.2
	vacuumEvery  = time.Minute
)

// VacuumChurned runs VACUUM on each of churnedTables whose dead rows pile
// up, and returns the tables it vacuumed. VACUUM takes no lock that
// ingest's or a reader's statements wait for.
func (s *Store) VacuumChurned(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables
		WHERE schemaname = current_schema() AND relname = ANY($1)
		  AND n_dead_tup >= greatest($2::float8, $3::float8 * n_live_tup)
		  AND coalesce(greatest(last_vacuum, last_autovacuum), '-infinity') < now() - $4::interval
		ORDER BY n_dead_tup DESC`, churnedTables, float64(deadRows), deadFraction, vacuumEvery)
	if err != nil {
		return nil, fmt.Errorf("store: find tables to vacuum: %w", err)
	}
	rels, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: find tables to vacuum: %w", err)
	}
	for _, rel := range rels {
		start := time.Now()
		// rel is quoted by format('%I.%I') from the catalog.
		if _, err := s.pool.Exec(ctx, "VACUUM "+rel); err != nil {
			return nil, fmt.Errorf("store: vacuum %s: %w", rel, err)
		}
		s.log.Info("vacuumed a table rewritten as data arrives", "table", rel, "took", time.Since(start))
	}
	return rels, nil
}
