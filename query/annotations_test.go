package query_test

import (
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// TestAnnotationsByType checks that each kind of run event can be asked
// for on its own, so a dashboard can show checkpoints, overflow skips,
// restarts and evaluations as separate annotations.
func TestAnnotationsByType(t *testing.T) {
	e := newEnv(t)
	event := func(sec int64, typ, text string) api.Record {
		return api.Record{Event: &api.Event{Kind: "event", RunID: "a1", Time: api.T(t0.Add(time.Duration(sec) * time.Second)),
			Step: api.Ptr(sec), Type: typ, Text: text}}
	}
	e.write(runRec("a1", nil), runRec("a2", nil),
		event(50, "checkpoint", "saved step 50"),
		event(100, "overflow", "loss scale 65536 -> 32768"),
		event(120, "note", "lr lowered by hand"),
		event(150, "restart", "resumed from step 50"),
		event(160, "checkpoint", "saved step 160"),
		api.Record{Eval: &api.Eval{Kind: "eval", RunID: "a1", Step: api.Ptr(int64(200)), Time: api.T(t0.Add(200 * time.Second)), Accuracy: api.F(0.9)}},
		api.Record{Event: &api.Event{Kind: "event", RunID: "a2", Time: api.T(t0.Add(55 * time.Second)), Type: "checkpoint", Text: "other run"}},
	)
	for _, tc := range []struct {
		query string
		want  []string // "type@step"
	}{
		{"run_id=a1", []string{"checkpoint@50", "overflow@100", "note@120", "restart@150", "checkpoint@160", "eval@200"}},
		{"run_id=a1&type=checkpoint", []string{"checkpoint@50", "checkpoint@160"}},
		{"run_id=a1&type=overflow&type=restart", []string{"overflow@100", "restart@150"}},
		{"run_id=a1&type=eval", []string{"eval@200"}},
		{"run_id=a1&type=checkpoint,eval", []string{"checkpoint@50", "checkpoint@160", "eval@200"}},
		{"run_id=a1&type=nothing-of-this-kind", []string{}},
		// The time window still applies.
		{"run_id=a1&type=checkpoint&from=" + url.QueryEscape(t0.Add(100*time.Second).Format(time.RFC3339)), []string{"checkpoint@160"}},
		// Without a run, every run's events of the type.
		{"type=checkpoint", []string{"checkpoint@50", "checkpoint@-1", "checkpoint@160"}},
	} {
		var res api.AnnotationsResponse
		e.get("/annotations?"+tc.query, 200, &res)
		got := []string{}
		for _, a := range res.Annotations {
			step := int64(-1)
			if a.Step != nil {
				step = *a.Step
			}
			got = append(got, a.Type+"@"+strconv.FormatInt(step, 10))
			if !slices.Contains(a.Tags, a.Type) {
				t.Errorf("%s: annotation %+v is not tagged with its type", tc.query, a)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("/annotations?%s: %v, want %v", tc.query, got, tc.want)
		}
	}
	var ae api.Error
	e.get("/annotations?type=%07bell", 400, &ae)
	if ae.Param != "type" {
		t.Errorf("control character in type: %+v", ae)
	}
}
