package plugin

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"

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
		// Said to be running, silent for 50 minutes, no end record: the
		// window ends at its last record.
		{"silent without end", api.RunSummary{RunID: "e", Status: "running", StartedAt: &start, LastSeenAt: &end}, time.Time{},
			map[string]string{"span": "3744s", "shift": "7128s", "to": itoa(end.Add(72 * time.Second).UnixMilli())}},
		{"running, a record a minute ago", api.RunSummary{RunID: "f", Status: "running", StartedAt: &running, LastSeenAt: ptrTime(now.Add(-time.Minute))}, time.Time{},
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

// With run "*" (the GPU nodes dashboard's All) the window is that of the
// project's newest run.
func TestWindowOfAllIsTheNewestRun(t *testing.T) {
	base := startServer(t)
	ingest(t, base, []map[string]any{
		{"kind": "run", "run_id": "older", "project": "w", "started_at": ts(0)},
		{"kind": "end", "run_id": "older", "time": ts(time.Hour), "status": "finished"},
		{"kind": "run", "run_id": "newer", "project": "w", "started_at": ts(2 * time.Hour)},
		{"kind": "end", "run_id": "newer", "time": ts(3 * time.Hour), "status": "finished"},
	})
	tp := startPlugin(t)
	pc := pluginContext("window-all", base, readToken)
	get := func(query string) string {
		t.Helper()
		var s sink
		if err := tp.Client.CallResource(context.Background(), &backend.CallResourceRequest{
			PluginContext: pc, Path: api.VariableWindow, Method: http.MethodGet, URL: api.VariableWindow + "?" + query}, &s); err != nil {
			t.Fatal(err)
		}
		if s.resp.Status != http.StatusOK {
			t.Fatalf("%s: %d %s", query, s.resp.Status, s.resp.Body)
		}
		var opts []Option
		if err := json.Unmarshal(s.resp.Body, &opts); err != nil || len(opts) != 1 {
			t.Fatalf("%s: %s", query, s.resp.Body)
		}
		return opts[0].Value
	}
	if all, newer := get("run=*&project=w&part=from"), get("run=newer&part=from"); all != newer {
		t.Errorf("window of All starts at %s, want the newest run's %s", all, newer)
	}
}

func ptrTime(t time.Time) *time.Time { return &t }
