package detect

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
)

// The table has one detector per alert kind, each with a title, a
// severity and a function, and its thresholds are fields of Config that
// a run's meta can override; every field of Config is read by some
// detector.
func TestTableCoversEveryKindAndThreshold(t *testing.T) {
	var kinds []string
	read := map[string]bool{}
	for _, d := range Table {
		kinds = append(kinds, d.Kind)
		if d.Title == "" || (d.Severity != Critical && d.Severity != Warning) || d.Detect == nil {
			t.Errorf("detector %q: title %q, severity %q, function set %v", d.Kind, d.Title, d.Severity, d.Detect != nil)
		}
		for _, th := range d.Thresholds {
			read[th] = true
		}
	}
	if got, want := slices.Sorted(slices.Values(kinds)), slices.Sorted(slices.Values(api.AlertKinds)); !slices.Equal(got, want) {
		t.Errorf("table kinds %v; want one detector per kind %v", got, want)
	}
	fields := map[string]bool{}
	for f := range reflect.TypeFor[Config]().Fields() {
		fields[strings.Split(f.Tag.Get("json"), ",")[0]] = true
	}
	for th := range read {
		if !fields[th] {
			t.Errorf("threshold %q is not a field of Config", th)
		}
	}
	for f := range fields {
		if !read[f] {
			t.Errorf("Config field %q is read by no detector in the table", f)
		}
	}
}

// An idle GPU fires once it has stayed below the utilisation threshold
// for the idle span of sample time, while the run runs.
func TestIdleGPU(t *testing.T) {
	cfg := Defaults()
	now := time.Now()
	rank := 1
	gpus := []GPUState{
		{Host: "n1", GPU: 0, Rank: &rank, Last: now, IdleSince: now.Add(-3 * time.Minute), LastUtil: 2},
		{Host: "n1", GPU: 1, Last: now, IdleSince: now.Add(-time.Minute), LastUtil: 2},       // idle, not for long
		{Host: "n1", GPU: 2, Last: now, IdleSince: now.Add(-10 * time.Minute), LastUtil: 95}, // busy now
	}
	fs := Run(cfg, Rows{GPUs: gpus, Running: true, Now: now})
	if len(fs) != 1 || fs[0].Kind != api.AlertIdleGPU || fs[0].Subject != "n1/gpu 0" || *fs[0].Rank != 1 {
		t.Fatalf("firings %+v; want GPU 0 of n1 idle on rank 1", fs)
	}
	if fs := Run(cfg, Rows{GPUs: gpus, Now: now}); len(fs) != 0 {
		t.Errorf("a finished run's GPUs fired %+v", fs)
	}
}

// docs/alerts.md's table of detectors (its section "Detectors and
// defaults") has a row for every detector of the table, and names no kind
// the table lacks.
func TestDocsListEveryDetector(t *testing.T) {
	const path = "../docs/alerts.md"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Detectors and defaults\n")
	if !ok {
		t.Fatalf("%s has no section \"Detectors and defaults\"", path)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var documented []string
	for _, l := range strings.Split(section, "\n") {
		if rest, ok := strings.CutPrefix(l, "| `"); ok {
			if kind, _, ok := strings.Cut(rest, "` |"); ok {
				documented = append(documented, kind)
			}
		}
	}
	var kinds []string
	for _, d := range Table {
		kinds = append(kinds, d.Kind)
	}
	slices.Sort(documented)
	slices.Sort(kinds)
	if !slices.Equal(documented, kinds) {
		t.Errorf("%s's table of detectors lists %v; the detectors are %v", path, documented, kinds)
	}
}
