package alerts

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/deepseed/deepseed/alerts/detect"
	"github.com/deepseed/deepseed/api"
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
func recentHangs(ctx context.Context, q querier, runID string, after time.Time) ([]detect.HangReport, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT ON (rank) rank, time, step, text FROM events
		WHERE run_id = $1 AND type = $2 AND time > $3 AND rank >= 0 ORDER BY rank, time DESC`, runID, api.EventHang, after)
	if err != nil {
		return nil, fmt.Errorf("alerts: hang events of %s: %w", runID, err)
	}
	defer rows.Close()
	var out []detect.HangReport
	for rows.Next() {
		var h detect.HangReport
		var text string
		if err := rows.Scan(&h.Rank, &h.Time, &h.Step, &text); err != nil {
			return nil, fmt.Errorf("alerts: hang events of %s: %w", runID, err)
		}
		var t hangText
		if json.Unmarshal([]byte(text), &t) == nil {
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
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("alerts: hang events of %s: %w", runID, err)
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
