package store_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store/storetest"
)

// TestLayoutReport measures the layouts the steps and layer times could
// have on TimescaleDB: the same realistic data as TestCompressionReport,
// copied into a scratch hypertable per layout (timings as 0.1 µs
// integers, floats as real, layer times as arrays of real or int, or one
// row per layer), compressed, and compared per step before and after
// compression. Compression ratios alone mislead here: one row per layer
// compresses 24x but holds six times the bytes while uncompressed (the
// chunks being written) and takes 27 times the rows to ingest. A report,
// not a check: DEEPSEED_LAYOUT_REPORT=1 on a machine with TimescaleDB.
func TestLayoutReport(t *testing.T) {
	if os.Getenv("DEEPSEED_LAYOUT_REPORT") == "" {
		t.Skip("a report: set DEEPSEED_LAYOUT_REPORT=1 to run it")
	}
	if !storetest.Mode(t).Timescale {
		t.Skip("needs TimescaleDB")
	}
	ctx := context.Background()
	s := storetest.NewStore(t)
	loadRealistic(t, s, time.Now().Add(-40*24*time.Hour))
	var b strings.Builder
	exps := []struct{ name, create, seg, order string }{
		{"steps (as is)", `CREATE TABLE x AS SELECT * FROM steps`, "run_id, rank", "step"},
		{"steps, ms as bigint 0.1us", `CREATE TABLE x AS SELECT run_id, rank, step, time, epoch, loss, lr, grad_norm, loss_scale, skipped, samples, tokens,
			throughput_sps, throughput_tps, round(step_ms*1e4)::bigint step_ms, round(forward_ms*1e4)::bigint forward_ms, round(backward_ms*1e4)::bigint backward_ms,
			round(optimizer_ms*1e4)::bigint optimizer_ms, round(comm_ms*1e4)::bigint comm_ms, round(data_ms*1e4)::bigint data_ms,
			gpu_util_pct, gpu_mem_used_gb, gpu_mem_peak_gb, gpu_mem_reserved_gb, cpu_util_pct, metrics FROM steps`, "run_id, rank", "step"},
		{"steps, ms bigint + floats as real", `CREATE TABLE x AS SELECT run_id, rank, step, time, epoch::real, loss::real, lr, grad_norm::real, loss_scale::real, skipped, samples, tokens,
			throughput_sps::real, throughput_tps::real, round(step_ms*1e4)::bigint step_ms, round(forward_ms*1e4)::bigint forward_ms, round(backward_ms*1e4)::bigint backward_ms,
			round(optimizer_ms*1e4)::bigint optimizer_ms, round(comm_ms*1e4)::bigint comm_ms, round(data_ms*1e4)::bigint data_ms,
			gpu_util_pct::real, gpu_mem_used_gb::real, gpu_mem_peak_gb::real, gpu_mem_reserved_gb::real, cpu_util_pct::real, metrics FROM steps`, "run_id, rank", "step"},
		{"steps lean: ms bigint, real, no derived", `CREATE TABLE x AS SELECT run_id, rank, step, time, epoch::real, loss::real, lr::real, grad_norm::real, loss_scale::real, skipped, samples, tokens,
			round(step_ms*1e4)::bigint step_ms, round(forward_ms*1e4)::bigint forward_ms, round(backward_ms*1e4)::bigint backward_ms,
			round(optimizer_ms*1e4)::bigint optimizer_ms, round(comm_ms*1e4)::bigint comm_ms, round(data_ms*1e4)::bigint data_ms,
			gpu_util_pct::real, gpu_mem_used_gb::real, gpu_mem_peak_gb::real, gpu_mem_reserved_gb::real, cpu_util_pct::real, metrics,
			sync_ns, round(sync_wait_ms*1e4)::bigint sync_wait_ms, round(input_wait_ms*1e4)::bigint input_wait_ms FROM steps`, "run_id, rank", "step"},
		{"steps lean, ms as bigint 1us", `CREATE TABLE x AS SELECT run_id, rank, step, time, epoch::real, loss::real, lr::real, grad_norm::real, loss_scale::real, skipped, samples, tokens,
			round(step_ms*1e3)::bigint step_ms, round(forward_ms*1e3)::bigint forward_ms, round(backward_ms*1e3)::bigint backward_ms,
			round(optimizer_ms*1e3)::bigint optimizer_ms, round(comm_ms*1e3)::bigint comm_ms, round(data_ms*1e3)::bigint data_ms,
			gpu_util_pct::real, gpu_mem_used_gb::real, gpu_mem_peak_gb::real, gpu_mem_reserved_gb::real, cpu_util_pct::real, metrics,
			sync_ns, round(sync_wait_ms*1e3)::bigint sync_wait_ms, round(input_wait_ms*1e3)::bigint input_wait_ms FROM steps`, "run_id, rank", "step"},
		{"layer_times (as is)", `CREATE TABLE x AS SELECT * FROM layer_times`, "run_id, rank", "step"},
		{"layer_times, real[]", `CREATE TABLE x AS SELECT run_id, rank, step, time, forward_ms::real[] f, backward_ms::real[] b FROM layer_times`, "run_id, rank", "step"},
		{"layer_times, int[] 0.1us", `CREATE TABLE x AS SELECT run_id, rank, step, time,
			(SELECT array_agg(round(v*1e4)::int) FROM unnest(forward_ms) v) f, (SELECT array_agg(round(v*1e4)::int) FROM unnest(backward_ms) v) b FROM layer_times`, "run_id, rank", "step"},
		{"layer rows, float8", `CREATE TABLE x AS SELECT run_id, rank, l::smallint AS layer, step, time, forward_ms[l] f, backward_ms[l] b
			FROM layer_times, generate_subscripts(forward_ms, 1) l`, "run_id, rank, layer", "step"},
		{"layer rows, bigint 0.1us", `CREATE TABLE x AS SELECT run_id, rank, l::smallint AS layer, step, time, round(forward_ms[l]*1e4)::bigint f, round(backward_ms[l]*1e4)::bigint b
			FROM layer_times, generate_subscripts(forward_ms, 1) l`, "run_id, rank, layer", "step"},
	}
	for _, e := range exps {
		for _, q := range []string{`DROP TABLE IF EXISTS x`, e.create,
			`SELECT create_hypertable('x', 'time', chunk_time_interval => interval '1 day', migrate_data => true)`,
			uniqueIndex(e.seg),
			fmt.Sprintf(`ALTER TABLE x SET (timescaledb.compress, timescaledb.compress_segmentby = '%s', timescaledb.compress_orderby = '%s')`, e.seg, e.order),
		} {
			if _, err := storetest.Pool(t, s).Exec(ctx, q); err != nil {
				t.Fatalf("%s: %s: %v", e.name, q, err)
			}
		}
		var rows int64
		storetest.Pool(t, s).QueryRow(ctx, `SELECT count(*) FROM x`).Scan(&rows)
		if _, err := storetest.Pool(t, s).Exec(ctx, `SELECT compress_chunk(c) FROM show_chunks('x') c`); err != nil {
			t.Fatal(err)
		}
		var before, after int64
		if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT before_compression_total_bytes, after_compression_total_bytes FROM hypertable_compression_stats('x')`).Scan(&before, &after); err != nil {
			t.Fatal(err)
		}
		var steps int64
		storetest.Pool(t, s).QueryRow(ctx, `SELECT count(DISTINCT (run_id, rank, step)) FROM x`).Scan(&steps)
		fmt.Fprintf(&b, "%-36s rows %8d  before %8.0f B/step  after %7.1f B/step  ratio %5.1fx\n", e.name, rows,
			float64(before)/float64(steps), float64(after)/float64(steps), float64(before)/float64(after))
	}
	t.Log("\n" + b.String())
}

// uniqueIndex is the unique index the real table has, so that "before"
// compares alike.
func uniqueIndex(seg string) string {
	if strings.Contains(seg, "layer") {
		return `CREATE UNIQUE INDEX ON x (run_id, rank, layer, step, time)`
	}
	return `CREATE UNIQUE INDEX ON x (run_id, rank, step, time)`
}
