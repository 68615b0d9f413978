package query

import (
	"context"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// gpuRawSpan is the longest span of samples /gpus buckets from the
// samples themselves; a longer one is read from the per-GPU minute
// rollups, whose buckets are whole minutes (docs/scale.md).
const gpuRawSpan = 5 * time.Minute

// gpuAnswerPoints is how many points a /gpus answer from the minute
// rollups holds at most in all its series (at about 70 bytes a point in
// JSON, some 170 KB), unless that leaves a series fewer than
// gpuMinPoints: a panel of 8 GPUs and 4 metrics gets 75 points a line,
// one of a single GPU and metric max_points.
const (
	gpuAnswerPoints = 2400
	gpuMinPoints    = 10
)

// gpuMinutes answers /gpus from the per-GPU minute rollups when the
// samples sel picks in [from, to] span more than gpuRawSpan, in buckets
// of whole minutes sized to the panel: max_points a series, fewer where
// the answer's series together would hold more than gpuAnswerPoints. It
// reports whether it answered; a shorter span is left to the samples,
// which answer as they always did.
func (h *Handler) gpuMinutes(ctx context.Context, metrics []string, sel store.GPUSelect, from, to time.Time, maxPoints int64, gpu *int64, out *api.GPUResponse) (bool, error) {
	first, last, gpus, err := h.store.GPUMinuteSpan(ctx, sel, from, to)
	if err != nil || first == nil || last == nil {
		return false, err
	}
	span := last.Sub(*first)
	if span <= gpuRawSpan {
		return false, nil
	}
	if sel.RunID != "" && sel.Host == "" && sel.Rank == nil && gpu == nil {
		bucket := time.Duration(int64(span) / maxPoints)
		spread, err := h.gpuSpreadOf(ctx, gpus, metrics, sel, from, to, bucket, h.store.GPUMinuteSpread, out)
		if err != nil || spread {
			return true, err
		}
	}
	if gpu != nil {
		gpus = 1
	}
	points := min(maxPoints, max(gpuMinPoints, gpuAnswerPoints/int64(max(1, gpus*len(metrics)))))
	bucket := time.Duration(int64(span)/points) + 1
	series, err := h.store.GPUMinuteSeries(ctx, metrics, sel, from, to, bucket)
	if err != nil {
		return true, err
	}
	gpuSeries(out, metrics, series, gpu)
	return true, nil
}
