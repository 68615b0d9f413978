package plugin

import (
	"strconv"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// TestRunWindow checks the parts a run-scoped panel's time override is
// made of: a finished run's window is its start to end with a 2 % margin
// (at least 5 s), shifted back by how long ago it ended; a running run's
// window ends now; an explicit past range turns the shift off.
func TestRunWindow(t *testing.T) {
	now := time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)
	start := now.Add(-3 * time.Hour)
	end := now.Add(-2 * time.Hour) // a one-hour run that ended two hours ago
	running := now.Add(-10 * time.Minute)
	cases := []struct {
		name     string
		run      api.RunSummary
		pickerTo time.Time
		want     map[string]string
	}{
		{"finished", api.RunSummary{RunID: "a", Status: "finished", StartedAt: &start, EndedAt: &end}, time.Time{},
			// margin 72 s each side: span 3600+144 s, end+72 s is 7128 s ago.
			map[string]string{"span": "3744s", "shift": "7128s",
				"from": itoa(start.Add(-72 * time.Second).UnixMilli()), "to": itoa(end.Add(72 * time.Second).UnixMilli())}},
		{"relative picker", api.RunSummary{RunID: "a", Status: "finished", StartedAt: &start, EndedAt: &end}, now.Add(-10 * time.Second),
			map[string]string{"shift": "7128s"}},
		{"explicit picker", api.RunSummary{RunID: "a", Status: "finished", StartedAt: &start, EndedAt: &end}, end,
			map[string]string{"shift": "0s", "span": "3744s"}},
		{"running", api.RunSummary{RunID: "b", Status: "running", StartedAt: &running}, time.Time{},
			// margin 12 s on the left; the window ends now.
			map[string]string{"span": "612s", "shift": "0s", "to": itoa(now.UnixMilli())}},
		{"killed without end", api.RunSummary{RunID: "c", Status: "killed", StartedAt: &start, LastSeenAt: &end}, time.Time{},
			map[string]string{"span": "3744s", "shift": "7128s"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, err := windowOf(c.run, now)
			if err != nil {
				t.Fatal(err)
			}
			for part, want := range c.want {
				got, err := w.part(part, now, c.pickerTo)
				if err != nil || got != want {
					t.Errorf("%s = %q, %v; want %q", part, got, err, want)
				}
			}
		})
	}
	if _, err := windowOf(api.RunSummary{RunID: "d"}, now); err == nil {
		t.Error("a run without a start time has a window")
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
