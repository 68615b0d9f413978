package api

import (
	"testing"
	"time"
)

func TestShownStatus(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	at := func(ago time.Duration) *time.Time { v := now.Add(-ago); return &v }
	cases := []struct {
		status string
		last   *time.Time
		want   string
	}{
		{"running", at(30 * time.Second), "running"},
		{"running", at(SilentAfter), "running"},
		{"running", at(12 * time.Minute), "silent 12 min"},
		{"running", at(26*time.Hour + 5*time.Minute), "silent 26 h"},
		{"running", at(75 * time.Hour), "silent 3 d"},
		{"running", nil, "running"},
		{"finished", at(75 * time.Hour), "finished"},
		{"failed", at(time.Hour), "failed"},
	}
	for _, c := range cases {
		r := RunSummary{Status: c.status, LastSeenAt: c.last}
		if got := r.ShownStatus(now); got != c.want {
			t.Errorf("%s, last seen %v: %q, want %q", c.status, c.last, got, c.want)
		}
	}
}
