package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// metricRollupRows reads every row of the metric_rollups view as text, in
// key order (NaN, infinities and NULLs as PostgreSQL prints them).
func metricRollupRows(t *testing.T, s *store.Store) []string {
	t.Helper()
	rows, err := storetest.Pool(t, s).Query(context.Background(), `
		SELECT concat_ws(' ', run_id, rank, width, bucket, metric, first_step, first_time, coalesce(last_time::text, '-'),
		                 coalesce(min::text, '-'), coalesce(max::text, '-'), coalesce(sum::text, '-'), count)
		FROM metric_rollups ORDER BY run_id, rank, width, bucket, metric`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Migrations 0019 to 0021 move the built-in metrics' rows and those of
// the metrics across ranks into sets of a rank and bucket, and 0023 names
// each set's metrics by a shared layout; the metric_rollups view reads
// back exactly the rows that were there, user metrics and whole-run rows
// included; a refresh of blocks afterwards writes the same rows again,
// with no metric twice where moved rows and new sets meet.
func TestMigrationMovesMetricRollupsIntoSets(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := storetest.NewStore(t)
	pool := storetest.Pool(t, s)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// refresh refreshes the run until no marked block is left.
	refresh := func() {
		t.Helper()
		for {
			n, err := s.RefreshRollups(ctx, "mig")
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
		}
	}
	// Two ranks of 2,500 steps, both reporting their synchronisation, a
	// NaN loss now and then, user metrics on every third step, a loss
	// scale from step 1,500 on only.
	load := func() {
		t.Helper()
		exec(`INSERT INTO runs (run_id) VALUES ('mig')`)
		exec(`INSERT INTO steps (run_id, rank, step, time, loss, loss_scale, step_ms, sync_wait_ms, sync_ns, metrics)
			SELECT 'mig', r, s, '2026-01-01'::timestamptz + s * interval '1 second' + r * interval '1 ms',
			       CASE WHEN s % 997 = 0 THEN 'NaN'::float8 ELSE 3 - s / 1e4 + r END,
			       CASE WHEN s >= 1500 THEN 65536 END, 100 + (s * 7919) % 101, (s * r) % 7,
			       1767225600000000000::bigint + s::bigint * 1000000000 + r * 3000000,
			       CASE WHEN s % 3 = 0 THEN jsonb_build_object('tok', s % 11) END
			FROM generate_series(0, 2499) s, (VALUES (0), (1)) ranks(r)`)
		exec(`INSERT INTO rollup_dirty (run_id, rank, block) SELECT DISTINCT run_id, rank, step / 100 FROM steps`)
		refresh()
	}
	load()
	want := metricRollupRows(t, s)
	for _, m := range []string{" loss ", " loss_scale ", " metrics.tok ", " lateness_ms ", " step_ms "} {
		if !strings.Contains(strings.Join(want, "\n"), m) {
			t.Fatalf("no rollup of%sto move", m)
		}
	}

	// The schema as it was before 0019, with those rows in its table.
	ms, err := store.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	exec(`DROP SCHEMA public CASCADE; CREATE SCHEMA public;
		CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`)
	for _, m := range ms {
		if m.Version >= 19 {
			continue
		}
		exec(m.SQL)
		exec(`INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
	}
	// Connections that knew the dropped schema (TimescaleDB keeps state
	// of its own on each) are not used again.
	s.ResetConnections()
	for _, r := range want {
		f := strings.Fields(r)
		// run rank width bucket metric first_step date time last(date time) min max sum count
		exec(`INSERT INTO metric_rollups (run_id, rank, width, bucket, metric, first_step, first_time, last_time, min, max, sum, count)
			VALUES ($1, $2::int, $3::int, $4::bigint, $5, $6::bigint, $7::timestamptz, $8::timestamptz, $9::float8, $10::float8, $11::float8, $12::bigint)`,
			f[0], f[1], f[2], f[3], f[4], f[5], f[6]+" "+f[7], f[8]+" "+f[9], f[10], f[11], f[12], f[13])
	}
	applied, err := s.Migrate(ctx)
	// 0019–0021 are this test's; later ones follow them.
	if err != nil || len(applied) < 3 || applied[0] != "0019_metric_rollup_sets.sql" || applied[1] != "0020_sync_rollup_sets.sql" ||
		applied[2] != "0021_metric_set_bounds.sql" {
		t.Fatalf("migrate: %v, %v", applied, err)
	}
	same := func(when string) {
		t.Helper()
		got := metricRollupRows(t, s)
		if len(got) != len(want) {
			t.Fatalf("%s: %d rollup rows, want %d", when, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s: row %d is\n  %s\nwant\n  %s", when, i, got[i], want[i])
			}
		}
	}
	same("after the migration")
	if n := mustCount(t, s, `SELECT count(*) FROM metric_rollup_rows WHERE width > 0 AND metric NOT LIKE 'metrics.%'`); n != 0 {
		t.Fatalf("%d built-in rows or rows of metrics across ranks left in metric_rollup_rows", n)
	}
	for part, m := range map[int]string{0: "loss", 1: "lateness_ms"} {
		if n := mustCount(t, s, `SELECT count(*) FROM `+setsNamed+` WHERE part = $1 AND $2 = ANY(metrics)`, part, m); n == 0 {
			t.Fatalf("no sets of part %d holding %s written by the migrations", part, m)
		}
	}

	// Sets whose metrics share their bounds keep them once: all of width
	// 100, and the coarser ones that hold loss_scale (from step 1,500 on
	// only) keep one each.
	if n := mustCount(t, s, `SELECT count(*) FROM metric_rollup_sets WHERE width = 100 AND first_steps IS NOT NULL`); n != 0 {
		t.Fatalf("%d sets of width 100 keep their bounds metric by metric", n)
	}
	if n := mustCount(t, s, `SELECT count(*) FROM metric_rollup_sets WHERE width = 1000 AND bucket = 1 AND part = 0 AND first_steps IS NOT NULL`); n != 2 {
		t.Fatalf("%d sets of steps 1,000 to 1,999 keep their bounds metric by metric, want 2 (one a rank)", n)
	}

	// Every block refreshed again, over the moved rows.
	exec(`INSERT INTO rollup_dirty (run_id, rank, block) SELECT DISTINCT run_id, rank, step / 100 FROM steps WHERE step % 700 < 100`)
	refresh()
	same("after a refresh of part of the blocks")
	// Each set holds a metric once, its arrays of one length.
	if n := mustCount(t, s, `SELECT count(*) FROM `+setsNamed+` WHERE cardinality(metrics) <> cardinality(counts)
		OR cardinality(metrics) <> cardinality(first_times) OR cardinality(metrics) <> (SELECT count(DISTINCT m) FROM unnest(metrics) m)`); n != 0 {
		t.Fatalf("%d sets with a metric twice or arrays of unequal lengths", n)
	}
	// The sets share their lists of names: a few layouts for them all.
	sets, layouts := mustCount(t, s, `SELECT count(*) FROM metric_rollup_sets`), mustCount(t, s, `SELECT count(*) FROM metric_set_layouts`)
	if layouts == 0 || layouts*10 > sets {
		t.Fatalf("%d layouts for %d sets", layouts, sets)
	}
}

// setsNamed is metric_rollup_sets with each set's metrics' names.
const setsNamed = `(SELECT s.*, l.metrics FROM metric_rollup_sets s JOIN metric_set_layouts l ON l.layout = s.layout) sets`
