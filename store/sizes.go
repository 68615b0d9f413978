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
	// Hypertable is true on TimescaleDB for a hypertable; Compressed then
	// counts its compressed chunks and CompressedBytes their bytes.
	Hypertable      bool
	Chunks          int64
	Compressed      int64
	CompressedBytes int64
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
	{"metric_rollups", true}, {"metric_spread", true}, {"layer_rollups", true}, {"gpu_minutes", true},
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
	var ts bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'timescaledb')`).Scan(&ts); err != nil {
		return nil, fmt.Errorf("look up timescaledb: %w", err)
	}
	hyper := map[string]bool{}
	if ts {
		rows, err := conn.Query(ctx, `SELECT hypertable_name::text FROM timescaledb_information.hypertables
			WHERE hypertable_schema = current_schema()`)
		if err != nil {
			return nil, fmt.Errorf("list hypertables: %w", err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("list hypertables: %w", err)
		}
		for _, n := range names {
			hyper[n] = true
		}
	}
	out := make([]TableSize, 0, len(sizedTables))
	for _, t := range sizedTables {
		s := TableSize{Name: t.name, Derived: t.derived, Hypertable: hyper[t.name]}
		if s.Hypertable {
			// Chunks are tables of their own (the compressed ones beside
			// them): their statistics are summed.
			err = conn.QueryRow(ctx, `
				SELECT hypertable_size($1::text::regclass),
				       (SELECT count(*) FROM timescaledb_information.chunks c WHERE c.hypertable_name = $1::text),
				       (SELECT count(*) FROM timescaledb_information.chunks c WHERE c.hypertable_name = $1::text AND c.is_compressed),
				       coalesce((SELECT sum(after_compression_total_bytes)::bigint FROM chunk_compression_stats($1::text::regclass)), 0),
				       coalesce((SELECT sum(st.n_live_tup)::bigint FROM pg_stat_user_tables st
				                 JOIN timescaledb_information.chunks c ON c.chunk_schema = st.schemaname AND c.chunk_name = st.relname
				                 WHERE c.hypertable_name = $1::text), 0),
				       coalesce((SELECT sum(st.n_dead_tup)::bigint FROM pg_stat_user_tables st
				                 JOIN timescaledb_information.chunks c ON c.chunk_schema = st.schemaname AND c.chunk_name = st.relname
				                 WHERE c.hypertable_name = $1::text), 0)`, t.name).
				Scan(&s.Bytes, &s.Chunks, &s.Compressed, &s.CompressedBytes, &s.Live, &s.Dead)
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
