package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// GPU samples in compressed chunks.
//
// gpu_samples is segmented by host and GPU (see hypertables), not by run.
// A DELETE on it that filters on run_id makes TimescaleDB decompress every
// compressed batch holding a matching row into its chunk and then delete
// the rows: 5 to 10 s per million samples, as much disk written and left
// to vacuum, and an error (SQLSTATE 53400) once a transaction has
// decompressed more than timescaledb.max_tuples_decompressed_per_dml_transaction
// rows (100,000 by default). TimescaleDB deletes whole compressed batches
// without decompressing them only when every filter is on a segment
// column, which the hypertable cannot scope to one chunk (a filter on time
// counts as another column).
//
// So the samples to delete are found one segment (a host's GPU in one
// chunk) at a time, by a read of each compressed chunk: a segment whose
// rows all go is deleted whole, its compressed batches from the chunk's
// compressed table and its rows written since compression from the chunk
// itself (milliseconds for a million samples). The rows left, in segments
// shared with rows that stay and in uncompressed chunks, are deleted
// through the hypertable, with the decompression limit lifted for that
// transaction only: only the batches holding such rows are decompressed.
// docs/retention.md has the figures.

// compressedChunk is a compressed chunk of gpu_samples: the chunk, which
// holds the rows written since compression, and the table of its
// compressed batches, both quoted.
type compressedChunk struct {
	chunk, batches string
}

// gpuSegment is one host's GPU in one compressed chunk, and how many rows
// it holds.
type gpuSegment struct {
	host string
	gpu  int
	rows int64
}

// sampleFilter is a condition on the columns of gpu_samples AS g, over
// args ($1 is args[0]).
type sampleFilter struct {
	cond string
	args []any
}

// deleteGPUSamples deletes, in tx, the GPU samples that match one of
// filters and returns how many it deleted. Each filter must be a
// conjunction of comparisons of a column with a value: TimescaleDB checks
// those on compressed rows before it decompresses a batch, and
// decompresses every batch it reads for any other condition (an OR, an
// IN list, a subquery). whole is the union of filters in one condition,
// which may take any form: with hypertable set (gpu_samples is a
// TimescaleDB hypertable), it picks the segments to delete whole in the
// compressed chunks that start before notAfter (all of them when it is
// zero), and must be false for every row of the chunks that start later.
func deleteGPUSamples(ctx context.Context, tx pgx.Tx, hypertable bool, notAfter time.Time, whole sampleFilter, filters ...sampleFilter) (int64, error) {
	var deleted int64
	// For this transaction only, every statement is planned with its
	// values: TimescaleDB reads them to skip the batches that do not match,
	// and PostgreSQL needs a run id to use the index of attributed samples
	// (gpu_samples_run, WHERE run_id <> ''); a generic plan hides both.
	if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_custom_plan`); err != nil {
		return 0, fmt.Errorf("set plan_cache_mode: %w", err)
	}
	if hypertable {
		// And the rows of shared segments are decompressed, however many
		// there are.
		if _, err := tx.Exec(ctx, `SET LOCAL timescaledb.max_tuples_decompressed_per_dml_transaction = 0`); err != nil {
			return 0, fmt.Errorf("lift the decompression limit: %w", err)
		}
		chunks, err := compressedGPUChunks(ctx, tx, notAfter)
		if err != nil {
			return 0, err
		}
		for _, c := range chunks {
			n, err := deleteWholeGPUSegments(ctx, tx, c, whole)
			deleted += n
			if err != nil {
				return deleted, fmt.Errorf("chunk %s: %w", c.chunk, err)
			}
		}
	}
	for _, f := range filters {
		tag, err := tx.Exec(ctx, `DELETE FROM gpu_samples AS g WHERE `+f.cond, f.args...)
		if err != nil {
			return deleted, err
		}
		deleted += tag.RowsAffected()
	}
	return deleted, nil
}

// compressedGPUChunks returns the compressed chunks of gpu_samples that
// start before notAfter (all of them when it is zero). The table of a
// chunk's compressed batches is named only in TimescaleDB's catalog
// (2.x: _timescaledb_catalog.chunk.compressed_chunk_id); with a catalog
// that names it otherwise, or a chunk that has no such table, it returns
// none, and deleteGPUSamples deletes by its filters alone.
func compressedGPUChunks(ctx context.Context, tx pgx.Tx, notAfter time.Time) ([]compressedChunk, error) {
	var known bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
		WHERE attrelid = to_regclass('_timescaledb_catalog.chunk') AND attname = 'compressed_chunk_id' AND NOT attisdropped)`).Scan(&known); err != nil {
		return nil, fmt.Errorf("read TimescaleDB's catalog: %w", err)
	}
	if !known {
		return nil, nil
	}
	var bound any // NULL: no bound
	if !notAfter.IsZero() {
		bound = notAfter
	}
	rows, err := tx.Query(ctx, `SELECT format('%I.%I', i.chunk_schema, i.chunk_name), format('%I.%I', cc.schema_name, cc.table_name)
		FROM timescaledb_information.chunks i
		JOIN _timescaledb_catalog.chunk c ON c.schema_name = i.chunk_schema AND c.table_name = i.chunk_name
		JOIN _timescaledb_catalog.chunk cc ON cc.id = c.compressed_chunk_id
		WHERE i.hypertable_schema = current_schema() AND i.hypertable_name = 'gpu_samples' AND i.is_compressed
		  AND ($1::timestamptz IS NULL OR i.range_start < $1)
		ORDER BY i.range_start`, bound)
	if err != nil {
		return nil, fmt.Errorf("list compressed chunks: %w", err)
	}
	chunks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (compressedChunk, error) {
		var c compressedChunk
		err := r.Scan(&c.chunk, &c.batches)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("list compressed chunks: %w", err)
	}
	return chunks, nil
}

// deleteWholeGPUSegments deletes the segments of chunk c whose rows all
// satisfy whole and returns how many rows they held. The chunk and its
// compressed table are locked against writes first, so that no row that
// stays lands in such a segment between the read and the delete (writes
// into a compressed chunk, imports or a collector's spool, are rare and
// wait milliseconds) and no recompression moves its batches.
func deleteWholeGPUSegments(ctx context.Context, tx pgx.Tx, c compressedChunk, whole sampleFilter) (int64, error) {
	if _, err := tx.Exec(ctx, `LOCK TABLE `+c.chunk+`, `+c.batches+` IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		return 0, fmt.Errorf("lock: %w", err)
	}
	// A read of the chunk returns its compressed rows and those written
	// since, decompressed in memory.
	rows, err := tx.Query(ctx, `SELECT host, gpu, count(*) FROM `+c.chunk+` AS g
		GROUP BY host, gpu HAVING bool_and(coalesce(`+whole.cond+`, false))`, whole.args...)
	if err != nil {
		return 0, fmt.Errorf("find segments to delete whole: %w", err)
	}
	segs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (gpuSegment, error) {
		var g gpuSegment
		err := r.Scan(&g.host, &g.gpu, &g.rows)
		return g, err
	})
	if err != nil {
		return 0, fmt.Errorf("find segments to delete whole: %w", err)
	}
	var deleted int64
	for _, g := range segs {
		// host and gpu are columns of the compressed table too, one value
		// per batch: its batches of the segment go without decompression.
		for _, table := range []string{c.batches, c.chunk} {
			if _, err := tx.Exec(ctx, `DELETE FROM ONLY `+table+` WHERE host = $1 AND gpu = $2`, g.host, g.gpu); err != nil {
				return deleted, fmt.Errorf("delete segment %s/%d from %s: %w", g.host, g.gpu, table, err)
			}
		}
		deleted += g.rows
	}
	return deleted, nil
}
