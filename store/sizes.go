package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// What the database holds, table by table: the figures docs/scale.md
// reports as bytes per rank-step, raw data beside the state derived from
// it, read on a connection of its own (deepseed bench query --database-url).

// TableSize is one table's footprint.
type TableSize struct {
	Name string
	// Derived is true for state the server computes from the raw rows
	// (rollups, minute sums, scores, summaries), false for what clients sent.
	Derived bool
	// Bytes counts the table, its indexes and TOAST; a hypertable's chunks
	// too, compressed or not.
	Bytes int64
	// Hypertable is true on TimescaleDB for a hypertable; Chunks then
	// counts its chunks and Compressed the compressed ones.
	Hypertable bool
	Chunks     int64
	Compressed int64
	// Live and Dead are PostgreSQL's estimates of live and dead row
	// versions (pg_stat_user_tables; a hypertable's chunks summed).
	Live, Dead int64
}

// sizedTables are the tables the report covers, raw first.
var sizedTables = []struct {
	name    string
	derived bool
}{
	{"steps", false}, {"layer_times", false}, {"evals", false}, {"gpu_samples", false}, {"host_samples", false},
	{"events", false}, {"memory_breakdowns", false},
	{"metric_rollup_rows", true}, {"metric_rollup_sets", true}, {"metric_set_layouts", true}, {"metric_spread", true}, {"layer_rollups", true}, {"gpu_minutes", true},
	{"gpu_device_minutes", true}, {"gpu_minute_marks", true}, {"host_minutes", true}, {"rank_hosts", true}, {"rank_score_heads", true},
	{"rank_score_spans", true}, {"run_summaries", true}, {"rollup_dirty", true},
}

// TableSizes reports every table of sizedTables in the database of url.
func TableSizes(ctx context.Context, url string) ([]TableSize, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	hyper, err := timescaleTables(ctx, conn)
	if err != nil {
		return nil, err
	}
	out := make([]TableSize, 0, len(sizedTables))
	for _, t := range sizedTables {
		s := TableSize{Name: t.name, Derived: t.derived, Hypertable: hyper[t.name]}
		if s.Hypertable {
			// Chunks are tables of their own (the compressed ones beside
			// them): their statistics are summed.
			err = conn.QueryRow(ctx, `
				SELECT hypertable_size($1::text::regclass), count(*), count(*) FILTER (WHERE c.is_compressed),
				       coalesce(sum(st.n_live_tup), 0)::bigint, coalesce(sum(st.n_dead_tup), 0)::bigint
				FROM timescaledb_information.chunks c
				LEFT JOIN pg_stat_user_tables st ON st.schemaname = c.chunk_schema AND st.relname = c.chunk_name
				WHERE c.hypertable_name = $1::text`, t.name).
				Scan(&s.Bytes, &s.Chunks, &s.Compressed, &s.Live, &s.Dead)
		} else {
			err = conn.QueryRow(ctx, `
				SELECT pg_total_relation_size($1::text::regclass),
				       coalesce((SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = $1::text::regclass), 0),
				       coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::text::regclass), 0)`, t.name).
				Scan(&s.Bytes, &s.Live, &s.Dead)
		}
		if err != nil {
			return nil, fmt.Errorf("size of %s: %w", t.name, err)
		}
		out = append(out, s)
	}
	return out, nil
}
