package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/detect"
)

// The reads behind a run's comparison with its baseline and its drift
// against itself (docs/regression.md): its GPU samples over a window,
// its layers' means and its step blocks, each a bounded read however
// long the run.

// GPUWindowMinutes bounds the minutes of GPU samples GPUWindow reads:
// minutes spread evenly over the window when it holds more.
const GPUWindowMinutes = 60

// GPUWindow sums up the run's GPU samples in [from, to] (zero times: the
// whole run): the mean SM clock, overall and per host, the share of
// samples with a throttle class set (detect.ThrottleMask) and the GPUs
// that had one. It reads at most GPUWindowMinutes minutes of samples,
// chosen evenly among the minutes that hold some (gpu_minutes).
func (s *Store) GPUWindow(ctx context.Context, runID string, from, to time.Time) (detect.GPUWindow, error) {
	var w detect.GPUWindow
	if to.IsZero() {
		to = time.Now().Add(24 * time.Hour)
	}
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT minute FROM gpu_minutes
		WHERE run_id = $1 AND minute >= date_trunc('minute', $2::timestamptz) AND minute <= $3 ORDER BY minute`, runID, from, to)
	if err != nil {
		return w, fmt.Errorf("store: GPU minutes of %s: %w", runID, err)
	}
	minutes, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		return w, fmt.Errorf("store: GPU minutes of %s: %w", runID, err)
	}
	if len(minutes) > GPUWindowMinutes {
		picked := make([]time.Time, GPUWindowMinutes)
		for i := range picked {
			picked[i] = minutes[i*len(minutes)/GPUWindowMinutes]
		}
		minutes = picked
	}
	if len(minutes) == 0 {
		return w, nil
	}
	rows, err = s.pool.Query(ctx, `SELECT s.host, s.gpu, count(*), avg(s.sm_clock_mhz), count(s.sm_clock_mhz),
			count(*) FILTER (WHERE s.throttle_reasons & $5 <> 0), coalesce(bit_or(s.throttle_reasons & $5), 0),
			coalesce(sum(s.sm_clock_mhz) FILTER (WHERE s.throttle_reasons & $5 <> 0), 0), count(s.sm_clock_mhz) FILTER (WHERE s.throttle_reasons & $5 <> 0)
		FROM unnest($2::timestamptz[]) AS m(minute) CROSS JOIN LATERAL (
			SELECT host, gpu, sm_clock_mhz, throttle_reasons FROM gpu_samples s
			WHERE s.run_id = $1 AND s.run_id <> '' AND s.time >= m.minute AND s.time < m.minute + interval '1 minute'
			  AND s.time >= $3 AND s.time <= $4
		) s GROUP BY s.host, s.gpu ORDER BY s.host, s.gpu`, runID, minutes, from, to, int64(detect.ThrottleMask))
	if err != nil {
		return w, fmt.Errorf("store: GPU window of %s: %w", runID, err)
	}
	defer rows.Close()
	var clockSum float64
	var clockN, throttled int64
	hostSum, hostN := map[string]float64{}, map[string]int64{}
	var mask, thrN int64
	var thrSum float64
	for rows.Next() {
		var host string
		var gpu int
		var n, cn, tn, bits, tcn int64
		var clock *float64
		var tsum float64
		if err := rows.Scan(&host, &gpu, &n, &clock, &cn, &tn, &bits, &tsum, &tcn); err != nil {
			return w, fmt.Errorf("store: GPU window of %s: %w", runID, err)
		}
		w.Samples += int(n)
		throttled += tn
		thrSum, thrN = thrSum+tsum, thrN+tcn
		mask |= bits
		if clock != nil && cn > 0 {
			clockSum += *clock * float64(cn)
			clockN += cn
			hostSum[host] += *clock * float64(cn)
			hostN[host] += cn
		}
		if tn > 0 && float64(tn) >= float64(n)*detect.ThrottledPctFloor/100 {
			w.Throttled = append(w.Throttled, fmt.Sprintf("%s/gpu %d", host, gpu))
		}
	}
	if err := rows.Err(); err != nil {
		return w, fmt.Errorf("store: GPU window of %s: %w", runID, err)
	}
	if clockN > 0 {
		v := clockSum / float64(clockN)
		w.SMClockMHz = &v
		w.Hosts = map[string]float64{}
		for h, n := range hostN {
			w.Hosts[h] = hostSum[h] / float64(n)
		}
	}
	if thrN > 0 {
		v := thrSum / float64(thrN)
		w.ThrottledClockMHz = &v
	}
	if clockN > thrN {
		v := (clockSum - thrSum) / float64(clockN-thrN)
		w.FreeClockMHz = &v
	}
	if w.Samples > 0 {
		w.ThrottlePct = float64(throttled) / float64(w.Samples) * 100
	}
	w.Reasons = detect.ThrottleClasses(mask)
	return w, nil
}

// LayerMeanBlocks bounds the layer rollup blocks LayerMeans reads: the
// newest ones of the range.
const LayerMeanBlocks = 200

// LayerMeans returns the mean time of each layer and pass of one rank
// over the steps from fromStep on, keyed "<layer> forward" and "<layer>
// backward", from at most LayerMeanBlocks of the newest 100-step layer
// rollup blocks.
func (s *Store) LayerMeans(ctx context.Context, runID string, rank int, fromStep int64, names []string) (map[string]float64, error) {
	out := map[string]float64{}
	rows, err := s.pool.Query(ctx, `SELECT fwd_sums, fwd_counts, bwd_sums, bwd_counts FROM (
			SELECT bucket, fwd_sums, `+layerCountsSQL("", "fwd")+` AS fwd_counts, bwd_sums,
				`+layerCountsSQL("", "bwd")+` AS bwd_counts FROM layer_rollups
			WHERE run_id = $1 AND rank = $2 AND width = 100 AND bucket >= $3 / 100 ORDER BY bucket DESC LIMIT $4) b`,
		runID, rank, fromStep, LayerMeanBlocks)
	if err != nil {
		return nil, fmt.Errorf("store: layer means of %s: %w", runID, err)
	}
	defer rows.Close()
	var fs, bs []float64
	var fc, bc []int64
	for rows.Next() {
		var a, b []*float64
		var ac, bcn []int64
		if err := rows.Scan(&a, &ac, &b, &bcn); err != nil {
			return nil, fmt.Errorf("store: layer means of %s: %w", runID, err)
		}
		fs, fc = addLayerSums(fs, fc, a, ac)
		bs, bc = addLayerSums(bs, bc, b, bcn)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: layer means of %s: %w", runID, err)
	}
	for i, name := range names {
		if i < len(fs) && fc[i] > 0 {
			out[name+" forward"] = fs[i] / float64(fc[i])
		}
		if i < len(bs) && bc[i] > 0 {
			out[name+" backward"] = bs[i] / float64(bc[i])
		}
	}
	return out, nil
}

func addLayerSums(sums []float64, counts []int64, s []*float64, c []int64) ([]float64, []int64) {
	for len(sums) < len(s) {
		sums, counts = append(sums, 0), append(counts, 0)
	}
	for i, v := range s {
		if v != nil && i < len(c) {
			sums[i] += *v
			counts[i] += c[i]
		}
	}
	return sums, counts
}

// DriftBlocks bounds the step blocks StepBlocks reads after the
// reference window.
const DriftBlocks = 200

// StepBlocks returns one rank's 100-step blocks from fromStep's block
// on: the first detect.DriftRefBlocks and the newest DriftBlocks, oldest
// first, each with its first and last step time and mean step time.
func (s *Store) StepBlocks(ctx context.Context, runID string, rank int, fromStep int64) ([]detect.StepBlock, error) {
	q := `SELECT m.bucket, m.first_step, m.first_time, coalesce(t.last_time, m.first_time), m.sum / m.count
		FROM metric_rollups m JOIN metric_rollups t ON t.run_id = m.run_id AND t.rank = m.rank AND t.width = m.width
		  AND t.bucket = m.bucket AND t.metric = 'step'
		WHERE m.run_id = $1 AND m.rank = $2 AND m.width = 100 AND m.metric = 'step_ms' AND m.count > 0 AND m.bucket >= $3 / 100`
	rows, err := s.pool.Query(ctx, `(`+q+` ORDER BY m.bucket LIMIT $4) UNION (`+q+` ORDER BY m.bucket DESC LIMIT $5) ORDER BY 1`,
		runID, rank, fromStep, detect.DriftRefBlocks, DriftBlocks)
	if err != nil {
		return nil, fmt.Errorf("store: step blocks of %s: %w", runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (detect.StepBlock, error) {
		var b detect.StepBlock
		var bucket int64
		err := r.Scan(&bucket, &b.FirstStep, &b.FirstTime, &b.LastTime, &b.StepMS)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: step blocks of %s: %w", runID, err)
	}
	return slices.Clip(out), nil
}

// ResumeEvents returns the steps the run resumed from (its events of type
// api.EventResume), oldest first, at most 100.
func (s *Store) ResumeEvents(ctx context.Context, runID string) ([]int64, error) {
	rows, err := s.pool.Query(ctx, `SELECT step FROM events WHERE run_id = $1 AND type = 'resume' AND step >= 0
		ORDER BY time LIMIT 100`, runID)
	if err != nil {
		return nil, fmt.Errorf("store: resumes of %s: %w", runID, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("store: resumes of %s: %w", runID, err)
	}
	return out, nil
}

// StepTimeAt returns the time of one rank's step, found false when it has
// none.
func (s *Store) StepTimeAt(ctx context.Context, runID string, rank int, step int64) (time.Time, bool, error) {
	var t time.Time
	err := s.pool.QueryRow(ctx, `SELECT time FROM steps WHERE run_id = $1 AND rank = $2 AND step = $3 ORDER BY time DESC LIMIT 1`,
		runID, rank, step).Scan(&t)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, false, nil
	}
	if err != nil {
		return t, false, fmt.Errorf("store: time of step %d of %s: %w", step, runID, err)
	}
	return t, true, nil
}
