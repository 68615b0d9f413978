package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The rollups of the metrics the refresher folds itself, the step metrics
// (rollupMetrics) and the metrics across ranks (SyncMetrics), are kept as
// sets: a row of metric_rollup_sets a rank, width, bucket and part, whose
// arrays hold each metric's name and figures at the same place (migrations
// 0019 and 0020). The metric_rollups view reads them back a row a metric.
// A set's metrics are those that hold a value, in no order of meaning.

// Parts of a bucket's sets, each written by its own pass.
const (
	stepSet int16 = 0 // rollupMetrics, by the metric rollups' pass
	syncSet int16 = 1 // SyncMetrics, by the spread's pass
)

// A set's metrics that all begin at one step and time and end at one time
// keep them once (first_step, first_time, last_time) and leave the arrays
// of them NULL; where they differ, the arrays hold them and the three
// columns are NULL (migration 0021).

// A set names its metrics by layout, a row of metric_set_layouts, which
// metric_set_layout gives for a list of names (migration 0023).

// setColumns are the columns of a width-100 set, in metricSet's order.
var setColumns = []string{"run_id", "rank", "width", "bucket", "part", "layout", "first_step", "first_time", "last_time",
	"mins", "maxs", "sums", "counts"}

// setLayout is the place of the layout in setColumns, which metricSet
// fills with the metrics' names and copySets with their layout.
const setLayout = 5

// copySets writes the width-100 sets of metricSet, each list of names
// looked up once, in the transaction tx.
func copySets(ctx context.Context, tx pgx.Tx, rows [][]any) error {
	layouts := map[string]int32{}
	for _, r := range rows {
		names := r[setLayout].([]string)
		key := strings.Join(names, "\x00")
		id, ok := layouts[key]
		if !ok {
			if err := tx.QueryRow(ctx, `SELECT metric_set_layout($1)`, names).Scan(&id); err != nil {
				return fmt.Errorf("look up the layout of a set: %w", err)
			}
			layouts[key] = id
		}
		r[setLayout] = id
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"metric_rollup_sets"}, setColumns, pgx.CopyFromRows(rows)); err != nil {
		return fmt.Errorf("write metric rollup sets: %w", err)
	}
	return nil
}

// metricSet is the width-100 set of part of bucket of rank: the metrics of
// names whose accumulators in m hold a value, every one from the bucket's
// first step and time to its last time (microseconds since the PostgreSQL
// epoch), which the set keeps once; its layout is the list of those names
// until copySets writes it. Nil when none holds a value.
func metricSet(runID string, rank int32, bucket int64, part int16, names []string, m []metricAcc, firstStep, firstTime, lastTime int64) []any {
	n := 0
	for _, a := range m {
		if a.n > 0 {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	ms := make([]string, 0, n)
	mins, maxs, sums := make([]float64, 0, n), make([]float64, 0, n), make([]float64, 0, n)
	counts := make([]int32, 0, n)
	for i, a := range m {
		if a.n > 0 {
			ms = append(ms, names[i])
			mins, maxs, sums, counts = append(mins, a.min), append(maxs, a.max), append(sums, a.sum), append(counts, int32(a.n))
		}
	}
	return []any{runID, rank, int32(100), bucket, part, ms, firstStep, pgTime(firstTime), pgTime(lastTime), mins, maxs, sums, counts}
}

// parentSetsSQL recomputes sets of width w from the sets of width cw =
// w / 10 below them (w and cw are the placeholders of the two widths), a
// metric at a time, summing in the order of the buckets: floating-point
// sums depend on their order, and every path to a figure adds them in that
// one. with opens the statement's WITH list; from is its FROM list, ending
// in "JOIN metric_rollup_sets m", and on the join's condition, which picks
// the children.
func parentSetsSQL(with, from, on, w, cw string) string {
	return `
WITH ` + with + `g AS (
	SELECT m.rank, m.bucket * ` + cw + ` / ` + w + ` AS bucket, m.part, u.metric,
	       min(coalesce(m.first_step, u.first_step)) AS fs,
	       (array_agg(CASE WHEN m.first_step IS NULL THEN u.first_time ELSE m.first_time END
	                  ORDER BY coalesce(m.first_step, u.first_step)))[1] AS ft,
	       max(CASE WHEN m.first_step IS NULL THEN u.last_time ELSE m.last_time END) AS lt,
	       min(u.min) AS mn, max(u.max) AS mx, sum(u.sum ORDER BY m.bucket) AS sm, sum(u.count)::integer AS n
	FROM ` + from + ` ` + on + ` JOIN metric_set_layouts l ON l.layout = m.layout,
	LATERAL unnest(l.metrics, m.first_steps, m.first_times, m.last_times, m.mins, m.maxs, m.sums, m.counts)
	    AS u(metric, first_step, first_time, last_time, min, max, sum, count)
	GROUP BY 1, 2, 3, 4
), s AS (
	SELECT rank, bucket, part, count(DISTINCT (fs, ft, lt)) = 1 AS same, min(fs) AS fs, min(ft) AS ft, max(lt) AS lt,
	       array_agg(metric ORDER BY metric) AS metrics, array_agg(fs ORDER BY metric) AS fss, array_agg(ft ORDER BY metric) AS fts,
	       array_agg(lt ORDER BY metric) AS lts, array_agg(mn ORDER BY metric) AS mns, array_agg(mx ORDER BY metric) AS mxs,
	       array_agg(sm ORDER BY metric) AS sms, array_agg(n ORDER BY metric) AS ns
	FROM g GROUP BY rank, bucket, part
)
INSERT INTO metric_rollup_sets (run_id, rank, width, bucket, part, layout, first_step, first_time, last_time,
	first_steps, first_times, last_times, mins, maxs, sums, counts)
SELECT $1, rank, ` + w + `, bucket, part, metric_set_layout(metrics), CASE WHEN same THEN fs END, CASE WHEN same THEN ft END, CASE WHEN same THEN lt END,
       CASE WHEN NOT same THEN fss END, CASE WHEN NOT same THEN fts END, CASE WHEN NOT same THEN lts END, mns, mxs, sms, ns
FROM s`
}

// parentMetricSetsSQL recomputes the step sets of width $4 that cover the
// given buckets (ranks $2, buckets $3) of width $5 = $4 / 10. The sets of
// SyncMetrics above the same blocks are the spread's pass's, which comes
// next in the same transaction and writes them for every rank.
var parentMetricSetsSQL = parentSetsSQL(`p AS (SELECT * FROM unnest($2::int[], $3::bigint[]) AS p(rank, bucket)),`,
	`p JOIN metric_rollup_sets m`, `ON m.run_id = $1 AND m.rank = p.rank AND m.width = $5 AND m.part = `+strconv.Itoa(int(stepSet))+`
	   AND m.bucket >= p.bucket * $4 / $5 AND m.bucket < (p.bucket + 1) * $4 / $5`, "$4", "$5")

// parentSyncSetsSQL recomputes, for every rank, the SyncMetrics sets of
// width $3 in the buckets $2 from the sets of width $4 = $3 / 10.
var parentSyncSetsSQL = parentSetsSQL("", `unnest($2::bigint[]) AS p(bucket) JOIN metric_rollup_sets m`,
	`ON m.run_id = $1 AND m.width = $4 AND m.part = `+strconv.Itoa(int(syncSet))+`
	   AND m.bucket >= p.bucket * ($3 / $4) AND m.bucket < (p.bucket + 1) * ($3 / $4)`, "$3", "$4")
