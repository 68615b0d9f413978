package store

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
)

// GPUSampleStats are figures of the GPU samples attributed to a run.
type GPUSampleStats struct {
	PeakMemBytes, MeanMemBytes, MeanUtil, TotalMemBytes *float64
	// Samples counts the samples aggregated; UtilSamples those with a
	// utilisation.
	Samples, UtilSamples int64
}

// GPUSampleStats aggregates the GPU samples attributed to runID within
// [from, to] (zero times: unbounded).
func (s *Store) GPUSampleStats(ctx context.Context, runID string, from, to time.Time) (*GPUSampleStats, error) {
	m, err := s.GPUSampleStatsOf(ctx, []string{runID}, from, to)
	if err != nil {
		return nil, err
	}
	return m[runID], nil
}

// GPUSampleStatsOf is [Store.GPUSampleStats] of each of runIDs over the
// same window, in one statement. Every id has an entry, zero for a run
// without samples.
func (s *Store) GPUSampleStatsOf(ctx context.Context, runIDs []string, from, to time.Time) (map[string]*GPUSampleStats, error) {
	// The minutes wholly inside the window from their sums (gpu_minutes),
	// the parts of minutes at its edges from the samples.
	w := minuteSplit(from, to)
	rows, err := s.pool.Query(ctx, `
		WITH p AS (
			SELECT run_id, max(mem_max) AS mx, sum(mem_sum) AS ms, sum(mem_n) AS mn, sum(util_sum) AS us, sum(util_n) AS un, max(total_max) AS tm
			FROM gpu_minutes WHERE run_id = ANY($1) AND $2::timestamptz IS NOT NULL AND minute >= $2 AND minute < $3
			GROUP BY run_id
			UNION ALL
			SELECT run_id, max(mem_used_bytes), sum(mem_used_bytes), count(mem_used_bytes), sum(util_pct), count(util_pct), max(mem_total_bytes)
			FROM gpu_samples WHERE run_id = ANY($1) AND run_id <> '' AND (
			     ($4::timestamptz IS NOT NULL AND time >= $4 AND time < $5)
			  OR ($6::timestamptz IS NOT NULL AND time >= $6 AND time <= $7))
			GROUP BY run_id
		)
		SELECT run_id, max(mx), sum(ms) / nullif(sum(mn), 0), sum(us) / nullif(sum(un), 0), max(tm),
		       coalesce(sum(mn), 0)::bigint, coalesce(sum(un), 0)::bigint FROM p GROUP BY run_id`,
		runIDs, w.minLo, w.minHi, w.rawLo1, w.rawHi1, w.rawLo2, w.rawHi2)
	if err != nil {
		return nil, fmt.Errorf("store: gpu samples of %s: %w", runsWhat(runIDs), err)
	}
	defer rows.Close()
	out := make(map[string]*GPUSampleStats, len(runIDs))
	for _, id := range runIDs {
		out[id] = &GPUSampleStats{}
	}
	for rows.Next() {
		var id string
		var g GPUSampleStats
		if err := rows.Scan(&id, &g.PeakMemBytes, &g.MeanMemBytes, &g.MeanUtil, &g.TotalMemBytes, &g.Samples, &g.UtilSamples); err != nil {
			return nil, fmt.Errorf("store: gpu samples of %s: %w", runsWhat(runIDs), err)
		}
		if out[id] != nil {
			out[id] = &g
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: gpu samples of %s: %w", runsWhat(runIDs), err)
	}
	return out, nil
}

// minuteWindow splits a time window into the whole minutes [minLo, minHi)
// that per-minute sums serve and at most two ranges of samples at its
// edges: [rawLo1, rawHi1) and [rawLo2, rawHi2]. A nil bound of a minute
// range means none; a zero from or to is unbounded.
type minuteWindow struct {
	minLo, minHi   *time.Time
	rawLo1, rawHi1 *time.Time
	rawLo2, rawHi2 *time.Time
}

var (
	timeMin = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	timeMax = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
)

func minuteSplit(from, to time.Time) minuteWindow {
	if from.IsZero() {
		from = timeMin
	}
	if to.IsZero() {
		to = timeMax
	}
	lo := from.Truncate(time.Minute)
	if lo.Before(from) {
		lo = lo.Add(time.Minute)
	}
	hi := to.Truncate(time.Minute)
	if !lo.Before(hi) {
		// No whole minute: every sample of the window is read.
		return minuteWindow{rawLo2: &from, rawHi2: &to}
	}
	w := minuteWindow{minLo: &lo, minHi: &hi, rawLo2: &hi, rawHi2: &to}
	if from.Before(lo) {
		w.rawLo1, w.rawHi1 = &from, &lo
	}
	return w
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// GPUSelect picks GPU samples: of one host, attributed to one run, and of
// one rank of that run; an empty string or nil Rank is no filter.
type GPUSelect struct {
	Host, RunID string
	Rank        *int
}

// GPUSeriesRow is one time bucket of one GPU metric.
type GPUSeriesRow struct {
	Host, UUID, Name, RunID string
	GPU                     int
	Time                    time.Time
	Mean, Min, Max          float64
}

// gpuColumns are the numeric gpu_samples columns /gpus can chart (the
// stored values of api.GPUMetrics), each with how a time bucket sums up
// its samples (value, min, max) as its row's Agg says. Gauges and
// counters average; a bucket of a bit mask holds every bit any of its
// samples set (min: the bits all of them set), since a mean of masks
// names no reason; the last XID is the bucket's newest.
var gpuColumns = map[string][3]string{}

func init() {
	for _, m := range api.GPUColumns() {
		c := m.Column
		switch m.Agg {
		case api.AggMean:
			gpuColumns[c] = [3]string{"avg(" + c + ")", "min(" + c + ")", "max(" + c + ")"}
		case api.AggLast:
			gpuColumns[c] = [3]string{"(array_agg(" + c + " ORDER BY time DESC) FILTER (WHERE " + c + " IS NOT NULL))[1]", "min(" + c + ")", "max(" + c + ")"}
		case api.AggBits:
			gpuColumns[c] = [3]string{"bit_or(" + c + ")::float8", "bit_and(" + c + ")::float8", "bit_or(" + c + ")::float8"}
		}
	}
}

// IsGPUMetric reports whether name is a gpu_samples column /gpus serves.
func IsGPUMetric(name string) bool { _, ok := gpuColumns[name]; return ok }

// GPUMetrics returns the names IsGPUMetric accepts, sorted.
func GPUMetrics() []string { return slices.Sorted(maps.Keys(gpuColumns)) }

// GPUSeries returns metrics of the GPU samples sel picks in [from, to], summed up over buckets of bucket length as
// gpuColumns says: for each metric, its rows ordered by host, gpu and
// time, skipping buckets where the metric has no value. Every row of a
// GPU names the UUID, model and run of its newest sample in the range.
//
// All metrics come from one pass over the samples: a day of 1 Hz samples
// of 8 GPUs is 691,200 rows, and reading them once per metric, with the
// identity of every bucket sorted out of arrays, took seconds.
func (s *Store) GPUSeries(ctx context.Context, metrics []string, sel GPUSelect, from, to time.Time, bucket time.Duration) (map[string][]GPUSeriesRow, error) {
	metrics = slices.Compact(slices.Clone(metrics))
	var cols strings.Builder
	for _, m := range metrics {
		agg, ok := gpuColumns[m]
		if !ok {
			return nil, fmt.Errorf("unknown gpu metric %q", m)
		}
		fmt.Fprintf(&cols, ", count(%s), %s, %s, %s", m, agg[0], agg[1], agg[2])
	}
	secs := max(1, int64(bucket/time.Second))
	rows, err := s.pool.Query(ctx, `
		SELECT host, gpu, date_bin(make_interval(secs => $5::float8), time, 'epoch'::timestamptz) AS t`+cols.String()+`
		FROM gpu_samples
		WHERE time >= $1 AND time <= $2 AND ($3 = '' OR host = $3) AND ($4 = '' OR run_id = $4) AND ($6::int IS NULL OR rank = $6)
		GROUP BY host, gpu, t ORDER BY host, gpu, t`, from, to, sel.Host, sel.RunID, secs, sel.Rank)
	if err != nil {
		return nil, fmt.Errorf("store: gpu series: %w", err)
	}
	out := map[string][]GPUSeriesRow{}
	var h string
	var gpu int
	var t time.Time
	counts := make([]int64, len(metrics))
	vals := make([][3]*float64, len(metrics))
	dst := []any{&h, &gpu, &t}
	for i := range metrics {
		dst = append(dst, &counts[i], &vals[i][0], &vals[i][1], &vals[i][2])
	}
	_, err = pgx.ForEachRow(rows, dst, func() error {
		for i, m := range metrics {
			if counts[i] == 0 || vals[i][0] == nil || vals[i][1] == nil || vals[i][2] == nil {
				continue
			}
			out[m] = append(out[m], GPUSeriesRow{Host: h, GPU: gpu, Time: t, Mean: *vals[i][0], Min: *vals[i][1], Max: *vals[i][2]})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: gpu series: %w", err)
	}
	// The identity of each GPU: its newest sample in the range, looked up
	// in the last bucket only.
	type key struct {
		host string
		gpu  int
	}
	ids := map[key][3]string{}
	rows, err = s.pool.Query(ctx, `
		SELECT DISTINCT ON (host, gpu) host, gpu, uuid, name, run_id FROM gpu_samples
		WHERE time >= greatest($1::timestamptz, $2::timestamptz - make_interval(secs => $5::float8)) AND time <= $2 AND ($3 = '' OR host = $3) AND ($4 = '' OR run_id = $4) AND ($6::int IS NULL OR rank = $6)
		ORDER BY host, gpu, time DESC`, from, to, sel.Host, sel.RunID, secs, sel.Rank)
	if err != nil {
		return nil, fmt.Errorf("store: gpu identities: %w", err)
	}
	var uuid, name, run string
	if _, err := pgx.ForEachRow(rows, []any{&h, &gpu, &uuid, &name, &run}, func() error {
		ids[key{h, gpu}] = [3]string{uuid, name, run}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("store: gpu identities: %w", err)
	}
	for _, rs := range out {
		for i := range rs {
			id := ids[key{rs[i].Host, rs[i].GPU}]
			rs[i].UUID, rs[i].Name, rs[i].RunID = id[0], id[1], id[2]
		}
	}
	return out, nil
}

// GPUTimeSpan returns the first and last sample time sel picks within
// [from, to].
func (s *Store) GPUTimeSpan(ctx context.Context, sel GPUSelect, from, to time.Time) (first, last *time.Time, err error) {
	err = s.pool.QueryRow(ctx, `SELECT min(time), max(time) FROM gpu_samples
		WHERE time >= $1 AND time <= $2 AND ($3 = '' OR host = $3) AND ($4 = '' OR run_id = $4) AND ($5::int IS NULL OR rank = $5)`,
		from, to, sel.Host, sel.RunID, sel.Rank).Scan(&first, &last)
	if err != nil {
		return nil, nil, fmt.Errorf("store: gpu time span: %w", err)
	}
	return first, last, nil
}

// GPUSpreadRow is one time bucket of a metric's distribution over GPUs:
// the lowest, 5th percentile, median, 95th percentile and highest of the
// GPUs' bucket means, their mean, and how many GPUs reported.
type GPUSpreadRow struct {
	Time                          time.Time
	Min, P5, Median, P95, Max, Mn float64
	GPUs                          int
}

// CountGPUs returns how many GPUs sel picks in [from, to].
func (s *Store) CountGPUs(ctx context.Context, sel GPUSelect, from, to time.Time) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT DISTINCT host, gpu FROM gpu_samples
		WHERE time >= $1 AND time <= $2 AND ($3 = '' OR host = $3) AND ($4 = '' OR run_id = $4) AND ($5::int IS NULL OR rank = $5)) g`,
		from, to, sel.Host, sel.RunID, sel.Rank).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("store: count gpus: %w", err)
	}
	return n, nil
}

// GPUSpread returns a gauge metric of the GPUs sel picks in [from, to] as
// its distribution over the GPUs, one row a time bucket, oldest first:
// what a chart of a thousand GPUs can show.
func (s *Store) GPUSpread(ctx context.Context, metric string, sel GPUSelect, from, to time.Time, bucket time.Duration) ([]GPUSpreadRow, error) {
	if m := api.GPUMetricNamed(metric); m == nil || m.Column == "" || m.Agg != api.AggMean {
		return nil, fmt.Errorf("store: gpu spread: no distribution of %q", metric)
	}
	secs := max(1, int64(bucket/time.Second))
	rows, err := s.pool.Query(ctx, `
		WITH g AS (
			SELECT date_bin(make_interval(secs => $5::float8), time, 'epoch'::timestamptz) AS t, avg(`+metric+`) AS v
			FROM gpu_samples
			WHERE time >= $1 AND time <= $2 AND ($3 = '' OR host = $3) AND ($4 = '' OR run_id = $4) AND ($6::int IS NULL OR rank = $6)
			  AND `+metric+` IS NOT NULL
			GROUP BY host, gpu, t)
		SELECT t, min(v), percentile_cont(0.05) WITHIN GROUP (ORDER BY v), percentile_cont(0.5) WITHIN GROUP (ORDER BY v),
		       percentile_cont(0.95) WITHIN GROUP (ORDER BY v), max(v), avg(v), count(*)::int
		FROM g GROUP BY t ORDER BY t`, from, to, sel.Host, sel.RunID, secs, sel.Rank)
	if err != nil {
		return nil, fmt.Errorf("store: gpu spread: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (GPUSpreadRow, error) {
		var g GPUSpreadRow
		err := r.Scan(&g.Time, &g.Min, &g.P5, &g.Median, &g.P95, &g.Max, &g.Mn, &g.GPUs)
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: gpu spread: %w", err)
	}
	return out, nil
}

// GPUActivity is one GPU's recent samples of a run, as the idle detector
// reads them.
type GPUActivity struct {
	Host     string
	GPU      int
	Rank     *int
	Last     time.Time  // newest sample
	LastBusy *time.Time // newest sample at or above the busy threshold
	First    time.Time  // oldest sample read
	LastUtil float64
}

// RecentGPUActivity reads each GPU's samples of the run over span before
// its newest sample, through the gpu_samples_run index; a sample is busy
// at busyPct or more.
func (s *Store) RecentGPUActivity(ctx context.Context, runID string, span time.Duration, busyPct float64) ([]GPUActivity, error) {
	rows, err := s.pool.Query(ctx, `WITH last AS (SELECT max(time) AS t FROM gpu_samples WHERE run_id = $1 AND run_id <> '')
		SELECT host, gpu, max(rank), max(time), max(time) FILTER (WHERE util_pct >= $3), min(time),
			(array_agg(util_pct ORDER BY time DESC))[1]
		FROM gpu_samples, last
		WHERE run_id = $1 AND run_id <> '' AND time > last.t - make_interval(secs => $2) AND util_pct IS NOT NULL
		GROUP BY host, gpu ORDER BY host, gpu`, runID, span.Seconds(), busyPct)
	if err != nil {
		return nil, fmt.Errorf("store: recent GPU samples of %s: %w", runID, err)
	}
	defer rows.Close()
	var out []GPUActivity
	for rows.Next() {
		var g GPUActivity
		if err := rows.Scan(&g.Host, &g.GPU, &g.Rank, &g.Last, &g.LastBusy, &g.First, &g.LastUtil); err != nil {
			return nil, fmt.Errorf("store: recent GPU samples of %s: %w", runID, err)
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: recent GPU samples of %s: %w", runID, err)
	}
	return out, nil
}

// gpuCols are the identity of a sample, its values as the metric table
// lists them (gpuStored), and its processes.
var gpuCols = append(append([]string{"time", "host", "gpu", "uuid", "name", "run_id", "rank"}, gpuStoredColumns()...), "processes")

func (b *batchPlan) gpuRow(i int, r []any) []any {
	g := b.gpus[i]
	var rank any
	if g.Rank != nil {
		rank = int32(*g.Rank)
	}
	r = append(r, g.Time.Time, g.Host, int32(*g.GPU), g.UUID, g.Name, g.RunID, rank)
	for _, m := range gpuStored {
		r = append(r, m.Value(g))
	}
	return append(r, jsonValue(g.Processes, len(g.Processes) == 0))
}

// gpuStored are the GPU values samples store, as api.GPUMetrics lists them.
var gpuStored = api.GPUColumns()

func gpuStoredColumns() []string {
	cols := make([]string, len(gpuStored))
	for i, m := range gpuStored {
		cols[i] = m.Column
	}
	return cols
}

// Samples from several collectors may overlap: inserting in key order
// keeps two batches from waiting on each other's rows crosswise.
// The samples written (not those already stored) are added to their
// minute's sums in the same statement; each collector adds to its own
// host's rows, so concurrent batches of one run do not queue on them.
// Each GPU's minute rollups (samples_gpu_minutes.go) take the samples of
// the minutes it has closed (a sample that came late); those of its open
// minutes are written when the refresher closes them
// (samples_gpu_close.go). A GPU seen for the first time gets its mark at
// its first minute here, before this statement (newGPUMarks).
// A rank's host (rank_hosts) changes only when a newer sample comes from
// another host: its row is not rewritten by every sample of the rank.
var mergeGPU = `WITH ins AS (
	INSERT INTO gpu_samples SELECT * FROM tmp_gpu_samples ORDER BY host, gpu, time ON CONFLICT DO NOTHING
	RETURNING *
), d AS (
	` + mergeGPUMinutes + `
), m AS (
	INSERT INTO gpu_minutes AS m (run_id, host, minute, samples, mem_n, mem_sum, mem_max, util_n, util_sum, util_min, total_max)
	SELECT run_id, host, date_trunc('minute', time), count(*), count(mem_used_bytes), sum(mem_used_bytes), max(mem_used_bytes),
	       count(util_pct), sum(util_pct), min(util_pct), max(mem_total_bytes)
	FROM ins WHERE run_id <> '' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
	ON CONFLICT (run_id, host, minute) DO UPDATE SET samples = m.samples + EXCLUDED.samples,
		mem_n = m.mem_n + EXCLUDED.mem_n, mem_sum = coalesce(m.mem_sum + EXCLUDED.mem_sum, m.mem_sum, EXCLUDED.mem_sum),
		mem_max = greatest(m.mem_max, EXCLUDED.mem_max), util_n = m.util_n + EXCLUDED.util_n,
		util_sum = coalesce(m.util_sum + EXCLUDED.util_sum, m.util_sum, EXCLUDED.util_sum),
		util_min = least(m.util_min, EXCLUDED.util_min),
		total_max = greatest(m.total_max, EXCLUDED.total_max)
), h AS (
	INSERT INTO rank_hosts AS h (run_id, rank, host, time)
	SELECT DISTINCT ON (run_id, rank) run_id, rank, host, time FROM ins
	WHERE run_id <> '' AND rank IS NOT NULL ORDER BY run_id, rank, time DESC
	ON CONFLICT (run_id, rank) DO UPDATE SET host = EXCLUDED.host, time = EXCLUDED.time
	WHERE h.time <= EXCLUDED.time AND h.host <> EXCLUDED.host
)
SELECT count(*) FROM ins`
