package alerts

import (
	"context"
	"fmt"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/detect"
	"github.com/deepseed/deepseed/store"
)

// recentHangs reads each rank's newest hang event of the run later than
// after.
func recentHangs(ctx context.Context, st *store.Store, runID string, after time.Time) ([]detect.HangReport, error) {
	events, err := st.NewestEvents(ctx, runID, api.EventHang, after)
	if err != nil {
		return nil, fmt.Errorf("alerts: %w", err)
	}
	var out []detect.HangReport
	for _, e := range events {
		out = append(out, detect.ParseHangReport(e.Rank, e.Time, e.Step, e.Text))
	}
	return out, nil
}

// newestStepTime is the time of the run's newest step over its ranks.
func newestStepTime(byRank map[int][]detect.StepRow) time.Time {
	var t time.Time
	for _, rows := range byRank {
		if len(rows) > 0 && rows[0].Time.After(t) {
			t = rows[0].Time
		}
	}
	return t
}
