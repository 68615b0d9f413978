package alerts

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/deepseed/deepseed/alerts/detect"
	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// hangText is what the hang detector (detect.HangReport) reads of a hang
// event's text.
type hangText struct {
	Reason         string `json:"reason"`
	Step           *int64 `json:"step"`
	LastCollective *struct {
		Name      string `json:"name"`
		Seq       int64  `json:"seq"`
		Completed *bool  `json:"completed"`
	} `json:"last_collective"`
}

// recentHangs reads each rank's newest hang event of the run later than
// after.
func recentHangs(ctx context.Context, st *store.Store, runID string, after time.Time) ([]detect.HangReport, error) {
	events, err := st.NewestEvents(ctx, runID, api.EventHang, after)
	if err != nil {
		return nil, fmt.Errorf("alerts: %w", err)
	}
	var out []detect.HangReport
	for _, e := range events {
		h := detect.HangReport{Rank: e.Rank, Time: e.Time, Step: e.Step}
		var t hangText
		if json.Unmarshal([]byte(e.Text), &t) == nil {
			h.Reason = t.Reason
			if t.Step != nil {
				h.Step = *t.Step
			}
			if c := t.LastCollective; c != nil {
				h.HasCollectives, h.Collective, h.Seq = true, c.Name, c.Seq
				h.InCollective = c.Completed != nil && !*c.Completed
			}
		}
		out = append(out, h)
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
