package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
)

// Per-GPU minute rollups (gpu_device_minutes, migration 0015): one row a
// host, GPU, minute, run and rank of the GPU samples, with every stored
// value summed up so that any bucket of whole minutes is what the samples
// inside it would give. They are written once a minute is over, from its
// samples, and a sample that comes later is added to its row by the
// statement that writes it (samples_gpu_close.go, mergeGPU); /gpus reads
// them for windows longer than gpuRawSpan (samples_gpu_read.go), and the
// samples of the minutes not closed yet. The columns of each value follow
// from its row in api.GPUMetrics:
//
//	AggMean: <c>_n, <c>_sum, <c>_min, <c>_max
//	AggLast: <c>_n, <c>_last, <c>_last_at (the time of the newest value), <c>_min, <c>_max
//	AggBits: <c>_n, <c>_or, <c>_and
//
// Each row also names the newest sample of its minute (last_time) and
// that sample's uuid and model, the identity /gpus gives a GPU. A sample
// without a rank is stored with rank -1.

// minuteCols returns, in order, the columns of gpu_device_minutes after
// the key, each with the aggregate over samples that fills it (the
// columns of s, a set of gpu_samples rows) and how two rows of one key
// merge (m: the stored row, EXCLUDED: the new one).
func minuteCols() (cols, aggs, merges []string) {
	add := func(c, agg, merge string) {
		cols, aggs, merges = append(cols, c), append(aggs, agg), append(merges, c+" = "+merge)
	}
	add("samples", "count(*)", "m.samples + EXCLUDED.samples")
	add("last_time", "max(time)", "greatest(m.last_time, EXCLUDED.last_time)")
	newer := "EXCLUDED.last_time >= m.last_time"
	add("uuid", "(array_agg(uuid ORDER BY time DESC))[1]", "CASE WHEN "+newer+" THEN EXCLUDED.uuid ELSE m.uuid END")
	add("name", "(array_agg(name ORDER BY time DESC))[1]", "CASE WHEN "+newer+" THEN EXCLUDED.name ELSE m.name END")
	sum := func(c string) string {
		return fmt.Sprintf("coalesce(m.%s + EXCLUDED.%s, m.%s, EXCLUDED.%s)", c, c, c, c)
	}
	for _, g := range api.GPUColumns() {
		c := g.Column
		add(c+"_n", "count("+c+")", fmt.Sprintf("m.%s_n + EXCLUDED.%s_n", c, c))
		switch g.Agg {
		case api.AggMean:
			add(c+"_sum", "sum("+c+")", sum(c+"_sum"))
		case api.AggLast:
			later := fmt.Sprintf("EXCLUDED.%s_last_at IS NOT NULL AND (m.%s_last_at IS NULL OR EXCLUDED.%s_last_at >= m.%s_last_at)", c, c, c, c)
			add(c+"_last", "(array_agg("+c+" ORDER BY time DESC) FILTER (WHERE "+c+" IS NOT NULL))[1]",
				fmt.Sprintf("CASE WHEN %s THEN EXCLUDED.%s_last ELSE m.%s_last END", later, c, c))
			add(c+"_last_at", "max(time) FILTER (WHERE "+c+" IS NOT NULL)", fmt.Sprintf("greatest(m.%s_last_at, EXCLUDED.%s_last_at)", c, c))
		case api.AggBits:
			add(c+"_or", "bit_or("+c+")", fmt.Sprintf("coalesce(m.%s_or | EXCLUDED.%s_or, m.%s_or, EXCLUDED.%s_or)", c, c, c, c))
			add(c+"_and", "bit_and("+c+")", fmt.Sprintf("coalesce(m.%s_and & EXCLUDED.%s_and, m.%s_and, EXCLUDED.%s_and)", c, c, c, c))
			continue
		}
		add(c+"_min", "min("+c+")", fmt.Sprintf("least(m.%s_min, EXCLUDED.%s_min)", c, c))
		add(c+"_max", "max("+c+")", fmt.Sprintf("greatest(m.%s_max, EXCLUDED.%s_max)", c, c))
	}
	return cols, aggs, merges
}

// minuteKey is the key of gpu_device_minutes, as a select list over
// gpu_samples rows.
const minuteKey = `host, gpu, date_trunc('minute', time), run_id, coalesce(rank, -1)`

// minuteSelect sums up the gpu_samples rows of from (a table or CTE name,
// with a WHERE clause when it needs one) into rows of gpu_device_minutes.
func minuteSelect(from string) string {
	_, aggs, _ := minuteCols()
	return `SELECT ` + minuteKey + `, ` + strings.Join(aggs, ", ") + ` FROM ` + from + ` GROUP BY 1, 2, 3, 4, 5`
}

// mergeGPUMinutes adds the samples of the CTE ins (those just written)
// that fall in their GPU's closed minutes (gpu_minute_marks) to those
// minutes' rows, in key order.
var mergeGPUMinutes = func() string {
	_, _, merges := minuteCols()
	return upsertMinutes("ins JOIN gpu_minute_marks k USING (host, gpu) WHERE time < k.closed_until", merges)
}()

// newGPUMarks gives each GPU of tmp_gpu_samples that has no mark yet one
// at the first minute of its samples: its minutes are open from there on.
// An existing mark is left as it is, not written.
const newGPUMarks = `INSERT INTO gpu_minute_marks (host, gpu, closed_until)
	SELECT host, gpu, date_trunc('minute', min(time)) FROM tmp_gpu_samples GROUP BY 1, 2 ORDER BY 1, 2
	ON CONFLICT (host, gpu) DO NOTHING`

// closeGPUMinutes writes the rows of the minutes [$3[i], $4[i]) of GPU
// $2[i] of host $1 from their samples, each row replaced whole: the
// samples are every one of those minutes while the host's lock is held
// (closeHostMinutes).
var closeGPUMinutes = func() string {
	cols, _, _ := minuteCols()
	sets := make([]string, len(cols))
	for i, c := range cols {
		sets[i] = c + " = EXCLUDED." + c
	}
	return upsertMinutes("gpu_samples JOIN unnest($2::int[], $3::timestamptz[], $4::timestamptz[]) AS w(gpu, lo, hi) USING (gpu) "+
		"WHERE host = $1 AND time >= w.lo AND time < w.hi", sets)
}()

// upsertMinutes writes the samples of from (minuteSelect) into their
// minutes' rows, in key order, a stored row taking sets (m: the stored
// row, EXCLUDED: the new one).
func upsertMinutes(from string, sets []string) string {
	cols, _, _ := minuteCols()
	return `INSERT INTO gpu_device_minutes AS m (host, gpu, minute, run_id, rank, ` + strings.Join(cols, ", ") + `)
	` + minuteSelect(from) + ` ORDER BY 1, 2, 3, 4, 5
	ON CONFLICT (host, gpu, minute, run_id, rank) DO UPDATE SET ` + strings.Join(sets, ", ")
}

// gpuMinuteUnion is a CTE u of gpu_device_minutes rows of the GPUs sel
// picks in [from, to]: the stored rows of the minutes wholly inside the
// window, and rows summed up on the fly from the samples in the parts of
// minutes at its edges, so that a bucket cut by the window holds exactly
// the samples inside it. Its parameters are $1..$5 (host, run, rank and
// the whole minutes) and $6..$9 (the edges), in args' order.
func gpuMinuteUnion(sel GPUSelect, metrics []string, from, to time.Time) (cte string, args []any) {
	// Only the columns of the metrics read, of a row of a hundred.
	var cols, aggs []string
	all, allAggs, _ := minuteCols()
	for i, c := range all {
		keep := c == "last_time" || c == "uuid" || c == "name"
		for _, m := range metrics {
			suffix, ok := strings.CutPrefix(c, m+"_")
			keep = keep || ok && slices.Contains([]string{"n", "sum", "min", "max", "last", "last_at", "or", "and"}, suffix)
		}
		if keep {
			cols, aggs = append(cols, c), append(aggs, allAggs[i])
		}
	}
	w := minuteSplit(from, to)
	// The whole minutes are the rows of each GPU's closed minutes and the
	// samples of its open ones (samples_gpu_close.go).
	cte = `u AS (
		SELECT host, gpu, minute, run_id, rank, ` + strings.Join(cols, ", ") + `
		FROM gpu_device_minutes JOIN gpu_minute_marks k USING (host, gpu)
		WHERE $4::timestamptz IS NOT NULL AND minute >= $4 AND minute < $5 AND minute < k.closed_until
		  AND ($1 = '' OR host = $1) AND ($2 = '' OR run_id = $2) AND ($3::int IS NULL OR rank = $3)
		UNION ALL
		SELECT ` + minuteKey + `, ` + strings.Join(aggs, ", ") + `
		FROM gpu_minute_marks k JOIN gpu_samples USING (host, gpu)
		WHERE $4::timestamptz IS NOT NULL AND k.closed_until < $5 AND time >= greatest($4, k.closed_until) AND time < $5
		  AND ($1 = '' OR host = $1) AND ($2 = '' OR run_id = $2) AND ($3::int IS NULL OR rank = $3)
		GROUP BY 1, 2, 3, 4, 5
		UNION ALL
		SELECT ` + minuteKey + `, ` + strings.Join(aggs, ", ") + ` FROM gpu_samples WHERE (($6::timestamptz IS NOT NULL AND time >= $6 AND time < $7)
		     OR ($8::timestamptz IS NOT NULL AND time >= $8 AND time <= $9))
		  AND ($1 = '' OR host = $1) AND ($2 = '' OR run_id = $2) AND ($3::int IS NULL OR rank = $3)
		GROUP BY 1, 2, 3, 4, 5
	)`
	return cte, []any{sel.Host, sel.RunID, sel.Rank, w.minLo, w.minHi, w.rawLo1, w.rawHi1, w.rawLo2, w.rawHi2}
}

// minuteAggs are the aggregates over rows of u that sum up a bucket of
// metric c as gpuColumns does over samples: its count, value, min, max.
func minuteAggs(c string) string {
	switch api.GPUMetricNamed(c).Agg {
	case api.AggLast:
		return fmt.Sprintf("sum(%s_n), (array_agg(%s_last ORDER BY %s_last_at DESC) FILTER (WHERE %s_last_at IS NOT NULL))[1], min(%s_min), max(%s_max)", c, c, c, c, c, c)
	case api.AggBits:
		return fmt.Sprintf("sum(%s_n), bit_or(%s_or)::float8, bit_and(%s_and)::float8, bit_or(%s_or)::float8", c, c, c, c)
	}
	return fmt.Sprintf("sum(%s_n), sum(%s_sum) / nullif(sum(%s_n), 0), min(%s_min), max(%s_max)", c, c, c, c, c)
}

// GPUMinuteSpan says what the minute rollups hold of the GPUs sel picks
// in [from, to], the samples of the GPUs' open minutes included: the start
// of the first minute and the newest sample (each within the window), and
// how many GPUs. first is nil when they hold nothing.
func (s *Store) GPUMinuteSpan(ctx context.Context, sel GPUSelect, from, to time.Time) (first, last *time.Time, gpus int, err error) {
	err = s.pool.QueryRow(ctx, `SELECT greatest(min(f), $1), least(max(l), $2), count(DISTINCT (host, gpu))::int FROM (
		SELECT host, gpu, min(minute) AS f, max(last_time) AS l
		FROM gpu_device_minutes JOIN gpu_minute_marks k USING (host, gpu)
		WHERE minute >= date_trunc('minute', $1::timestamptz) AND minute <= $2 AND minute < k.closed_until
		  AND ($3 = '' OR host = $3) AND ($4 = '' OR run_id = $4) AND ($5::int IS NULL OR rank = $5)
		GROUP BY host, gpu
		UNION ALL
		SELECT k.host, k.gpu, date_trunc('minute', o.f), o.l FROM gpu_minute_marks k,
		LATERAL (SELECT min(s.time) AS f, max(s.time) AS l FROM gpu_samples s
		         WHERE s.host = k.host AND s.gpu = k.gpu AND s.time >= greatest(date_trunc('minute', $1::timestamptz), k.closed_until)
		           AND s.time <= $2 AND ($4 = '' OR s.run_id = $4) AND ($5::int IS NULL OR s.rank = $5)) o
		WHERE k.closed_until <= $2 AND ($3 = '' OR k.host = $3) AND o.f IS NOT NULL
	) x`, from, to, sel.Host, sel.RunID, sel.Rank).Scan(&first, &last, &gpus)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("store: gpu minute span: %w", err)
	}
	return first, last, gpus, nil
}

// GPUMinuteSeries is [Store.GPUSeries] over the minute rollups, for
// buckets of whole minutes (bucket is rounded up to one): the same rows,
// each bucket's figures what its samples give (a mean is the sum of the
// minutes' sums over the sum of their counts). Every row of a GPU names
// the UUID, model and run of its newest sample in the range.
func (s *Store) GPUMinuteSeries(ctx context.Context, metrics []string, sel GPUSelect, from, to time.Time, bucket time.Duration) (map[string][]GPUSeriesRow, error) {
	metrics = slices.Compact(slices.Clone(metrics))
	var cols strings.Builder
	for _, m := range metrics {
		if !IsGPUMetric(m) {
			return nil, fmt.Errorf("unknown gpu metric %q", m)
		}
		cols.WriteString(", " + minuteAggs(m))
	}
	cte, args := gpuMinuteUnion(sel, metrics, from, to)
	args = append(args, minuteSecs(bucket))
	rows, err := s.pool.Query(ctx, `WITH `+cte+`
		SELECT host, gpu, date_bin(make_interval(secs => $10::float8), minute, 'epoch'::timestamptz) AS t,
		       (array_agg(uuid ORDER BY last_time DESC))[1], (array_agg(name ORDER BY last_time DESC))[1],
		       (array_agg(run_id ORDER BY last_time DESC))[1]`+cols.String()+`
		FROM u GROUP BY host, gpu, t ORDER BY host, gpu, t`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: gpu minute series: %w", err)
	}
	type key struct {
		host string
		gpu  int
	}
	out := map[string][]GPUSeriesRow{}
	ids := map[key][3]string{}
	var h, uuid, name, run string
	var gpu int
	var t time.Time
	counts := make([]*int64, len(metrics))
	vals := make([][3]*float64, len(metrics))
	dst := []any{&h, &gpu, &t, &uuid, &name, &run}
	for i := range metrics {
		dst = append(dst, &counts[i], &vals[i][0], &vals[i][1], &vals[i][2])
	}
	_, err = pgx.ForEachRow(rows, dst, func() error {
		// Rows come oldest first: the last one of a GPU is its newest.
		ids[key{h, gpu}] = [3]string{uuid, name, run}
		for i, m := range metrics {
			if counts[i] == nil || *counts[i] == 0 || vals[i][0] == nil || vals[i][1] == nil || vals[i][2] == nil {
				continue
			}
			out[m] = append(out[m], GPUSeriesRow{Host: h, GPU: gpu, Time: t, Mean: *vals[i][0], Min: *vals[i][1], Max: *vals[i][2]})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: gpu minute series: %w", err)
	}
	for _, rs := range out {
		for i := range rs {
			id := ids[key{rs[i].Host, rs[i].GPU}]
			rs[i].UUID, rs[i].Name, rs[i].RunID = id[0], id[1], id[2]
		}
	}
	return out, nil
}

// GPUMinuteSpread is [Store.GPUSpread] over the minute rollups, for
// buckets of whole minutes: each GPU's bucket mean from its minutes'
// sums, then their distribution over the GPUs.
func (s *Store) GPUMinuteSpread(ctx context.Context, metric string, sel GPUSelect, from, to time.Time, bucket time.Duration) ([]GPUSpreadRow, error) {
	if m := api.GPUMetricNamed(metric); m == nil || m.Column == "" || m.Agg != api.AggMean {
		return nil, fmt.Errorf("store: gpu spread: no distribution of %q", metric)
	}
	cte, args := gpuMinuteUnion(sel, []string{metric}, from, to)
	args = append(args, minuteSecs(bucket))
	rows, err := s.pool.Query(ctx, `WITH `+cte+`, g AS (
			SELECT date_bin(make_interval(secs => $10::float8), minute, 'epoch'::timestamptz) AS t,
			       sum(`+metric+`_sum) / sum(`+metric+`_n) AS v
			FROM u WHERE `+metric+`_n > 0 GROUP BY host, gpu, t)
		SELECT t, min(v), percentile_cont(0.05) WITHIN GROUP (ORDER BY v), percentile_cont(0.5) WITHIN GROUP (ORDER BY v),
		       percentile_cont(0.95) WITHIN GROUP (ORDER BY v), max(v), avg(v), count(*)::int
		FROM g GROUP BY t ORDER BY t`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: gpu minute spread: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (GPUSpreadRow, error) {
		var g GPUSpreadRow
		err := r.Scan(&g.Time, &g.Min, &g.P5, &g.Median, &g.P95, &g.Max, &g.Mn, &g.GPUs)
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: gpu minute spread: %w", err)
	}
	return out, nil
}

// minuteSecs is bucket in whole minutes, at least one, in seconds.
func minuteSecs(bucket time.Duration) int64 {
	return max(1, int64((bucket+time.Minute-1)/time.Minute)) * 60
}
