package store

import (
	"strconv"
	"time"
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

// setColumns are the columns of a set, in metricSet's order.
var setColumns = []string{"run_id", "rank", "width", "bucket", "part", "metrics", "first_steps", "first_times", "last_times",
	"mins", "maxs", "sums", "counts"}

// metricSet is the width-100 set of part of bucket of rank: the metrics of
// names whose accumulators in m hold a value, every one from the bucket's
// first step and time to its last time (microseconds since the PostgreSQL
// epoch). Nil when none holds a value.
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
	ft, lt := pgTime(firstTime), pgTime(lastTime)
	ms, fs := make([]string, 0, n), make([]int64, 0, n)
	fts, lts := make([]time.Time, 0, n), make([]time.Time, 0, n)
	mins, maxs, sums := make([]float64, 0, n), make([]float64, 0, n), make([]float64, 0, n)
	counts := make([]int64, 0, n)
	for i, a := range m {
		if a.n > 0 {
			ms, fs, fts, lts = append(ms, names[i]), append(fs, firstStep), append(fts, ft), append(lts, lt)
			mins, maxs, sums, counts = append(mins, a.min), append(maxs, a.max), append(sums, a.sum), append(counts, a.n)
		}
	}
	return []any{runID, rank, int32(100), bucket, part, ms, fs, fts, lts, mins, maxs, sums, counts}
}

// parentSetsSQL recomputes sets of width $W from the sets of width $CW =
// $W / 10 below them, a metric at a time, summing in the order of the
// buckets (floating-point sums depend on their order, and every path to a
// figure adds them in that one): from names the children that
// join (a FROM list ending in "JOIN metric_rollup_sets m ON", whose
// condition follows), and on the condition that picks them; w and cw are
// the placeholders of the two widths.
func parentSetsSQL(with, from, on, w, cw string) string {
	return `
WITH ` + with + `g AS (
	SELECT m.rank, m.bucket * ` + cw + ` / ` + w + ` AS bucket, m.part, u.metric, min(u.first_step) AS fs,
	       (array_agg(u.first_time ORDER BY u.first_step))[1] AS ft, max(u.last_time) AS lt,
	       min(u.min) AS mn, max(u.max) AS mx, sum(u.sum ORDER BY m.bucket) AS sm, sum(u.count)::bigint AS n
	FROM ` + from + ` ` + on + `,
	LATERAL unnest(m.metrics, m.first_steps, m.first_times, m.last_times, m.mins, m.maxs, m.sums, m.counts)
	    AS u(metric, first_step, first_time, last_time, min, max, sum, count)
	GROUP BY 1, 2, 3, 4
)
INSERT INTO metric_rollup_sets (run_id, rank, width, bucket, part, metrics, first_steps, first_times, last_times, mins, maxs, sums, counts)
SELECT $1, rank, ` + w + `, bucket, part, array_agg(metric ORDER BY metric), array_agg(fs ORDER BY metric), array_agg(ft ORDER BY metric),
       array_agg(lt ORDER BY metric), array_agg(mn ORDER BY metric), array_agg(mx ORDER BY metric), array_agg(sm ORDER BY metric),
       array_agg(n ORDER BY metric)
FROM g GROUP BY rank, bucket, part`
}

// parentMetricSetsSQL recomputes the sets, every part, of width $4 that
// cover the given buckets (ranks $2, buckets $3) of width $5 = $4 / 10.
var parentMetricSetsSQL = parentSetsSQL(`p AS (SELECT * FROM unnest($2::int[], $3::bigint[]) AS p(rank, bucket)),`,
	`p JOIN metric_rollup_sets m`, `ON m.run_id = $1 AND m.rank = p.rank AND m.width = $5
	   AND m.bucket >= p.bucket * $4 / $5 AND m.bucket < (p.bucket + 1) * $4 / $5`, "$4", "$5")

// parentSyncSetsSQL recomputes, for every rank, the SyncMetrics sets of
// width $3 in the buckets $2 from the sets of width $4 = $3 / 10.
var parentSyncSetsSQL = parentSetsSQL("", `unnest($2::bigint[]) AS p(bucket) JOIN metric_rollup_sets m`,
	`ON m.run_id = $1 AND m.width = $4 AND m.part = `+strconv.Itoa(int(syncSet))+`
	   AND m.bucket >= p.bucket * ($3 / $4) AND m.bucket < (p.bucket + 1) * ($3 / $4)`, "$3", "$4")
