package plugin

import (
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// TestRunsFrameSaysSilent: a run the server still holds as running but
// that has sent nothing for a day (killed without an end record) reads
// "silent 26 h" in the runs table and the Status card, not "running".
func TestRunsFrameSaysSilent(t *testing.T) {
	now := time.Date(2026, 12, 2, 20, 0, 0, 0, time.UTC)
	long, recent := now.Add(-26*time.Hour-10*time.Minute), now.Add(-20*time.Second)
	f := runsFrame("runs", []api.RunSummary{
		{RunID: "dead", Status: "running", LastSeenAt: &long},
		{RunID: "live", Status: "running", LastSeenAt: &recent},
		{RunID: "done", Status: "finished", LastSeenAt: &long},
	}, now)
	field, _ := f.FieldByName("status")
	if field == nil {
		t.Fatal("no status field")
	}
	want := []string{"silent 26 h", "running", "finished"}
	for i, w := range want {
		if got := field.At(i).(string); got != w {
			t.Errorf("row %d: status %q, want %q", i, got, w)
		}
	}
}
