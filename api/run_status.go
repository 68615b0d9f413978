package api

import (
	"fmt"
	"time"
)

// SilentAfter is how long a run said to be running may send nothing
// before views call it silent: its window ends at its last record and
// its status reads how long it has been quiet (a job killed without an
// end record stays "running" on the server).
const SilentAfter = 5 * time.Minute

// ShownStatus is the run's status as views show it at now: a running
// run without a record for SilentAfter reads "silent 26 h" (minutes
// under an hour, days past two), every other status as it is.
func (r RunSummary) ShownStatus(now time.Time) string {
	if r.Status != "running" || r.LastSeenAt == nil {
		return r.Status
	}
	d := now.Sub(*r.LastSeenAt)
	switch {
	case d <= SilentAfter:
		return r.Status
	case d < time.Hour:
		return fmt.Sprintf("silent %d min", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("silent %d h", int(d/time.Hour))
	default:
		return fmt.Sprintf("silent %d d", int(d/(24*time.Hour)))
	}
}
