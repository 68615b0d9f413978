package api_test

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/api"
)

// stepKey are the step record's fields outside the step table: its kind,
// key and user metrics.
var stepKey = []string{"kind", "run_id", "rank", "step", "time", "metrics"}

// Every value a step record carries is in the step table under its JSON
// name, once, with a field of a type the store can write; and every row
// names a field of the record.
func TestStepFieldsTableMatchesTheRecord(t *testing.T) {
	seen := map[string]bool{}
	fields := map[uintptr]string{}
	var s api.Step
	base := reflect.ValueOf(&s).Pointer()
	for _, f := range api.StepFields {
		if f.Name == "" || seen[f.Name] {
			t.Errorf("step field %q: empty or twice in the table", f.Name)
		}
		seen[f.Name] = true
		p := reflect.ValueOf(f.Field(&s))
		switch f.Field(&s).(type) {
		case **api.Float, **int64, **bool:
		default:
			t.Errorf("%s: a record field of type %T", f.Name, f.Field(&s))
			continue
		}
		off := p.Pointer() - base
		if other, ok := fields[off]; ok {
			t.Errorf("%s and %s name the same record field", f.Name, other)
		}
		fields[off] = f.Name
		sf := reflect.TypeOf(s).Field(fieldAt(t, off))
		if got := strings.Split(sf.Tag.Get("json"), ",")[0]; got != f.Name {
			t.Errorf("row %s names the record's field %s (json %q)", f.Name, sf.Name, got)
		}
		if f.Sum == api.StepCount && reflect.TypeOf(f.Field(&s)) != reflect.TypeOf((**bool)(nil)) {
			t.Errorf("%s: counted per bucket, but not a flag", f.Name)
		}
	}
	typ := reflect.TypeOf(s)
	for i := range typ.NumField() {
		name := strings.Split(typ.Field(i).Tag.Get("json"), ",")[0]
		if !seen[name] && !slices.Contains(stepKey, name) {
			t.Errorf("the step record's %s is not in api.StepFields", name)
		}
	}
}

// fieldAt is the index of the Step field at byte offset off.
func fieldAt(t *testing.T, off uintptr) int {
	t.Helper()
	typ := reflect.TypeOf(api.Step{})
	for i := range typ.NumField() {
		if typ.Field(i).Offset == off {
			return i
		}
	}
	t.Fatalf("no Step field at offset %d", off)
	return 0
}

// The validator refuses a negative duration (a value in ms) and a
// negative count by the table, naming the field; the same values
// positive are taken.
func TestValidatorChecksStepFieldsByTheTable(t *testing.T) {
	var checked int
	for _, f := range api.StepFields {
		var neg string
		switch f.Field(&api.Step{}).(type) {
		case **api.Float:
			if f.Unit != "ms" {
				continue
			}
			neg = "negative duration"
		case **int64:
			neg = "negative"
		default:
			continue
		}
		checked++
		for _, lit := range []string{"-1", "-1.5"} {
			if neg == "negative" && lit == "-1.5" {
				continue
			}
			body := fmt.Sprintf(`{"kind":"step","run_id":"r","rank":0,"step":1,%q:%s}`, f.Name, lit)
			_, err := api.DecodeBatch([]byte(body))
			var re *api.RecordError
			if !errors.As(err, &re) || re.Field != f.Name || re.Msg != neg {
				t.Errorf("%s: %v, want %s refused as %q", body, err, f.Name, neg)
			}
		}
		body := fmt.Sprintf(`{"kind":"step","run_id":"r","rank":0,"step":1,%q:2}`, f.Name)
		if _, err := api.DecodeBatch([]byte(body)); err != nil {
			t.Errorf("%s: %v", body, err)
		}
	}
	if checked < 10 {
		t.Fatalf("only %d step fields checked", checked)
	}
}

// A step value's legend is the table's label, or its name where the
// table gives none; the per-rank series keep theirs.
func TestStepLegendsAreTheTables(t *testing.T) {
	for _, f := range api.StepFields {
		want := f.Label
		if want == "" {
			want = f.Name
		}
		if got := api.MetricLabel(f.Name); got != want {
			t.Errorf("legend of %s = %q, want %q", f.Name, got, want)
		}
	}
	if got := api.MetricLabel("lateness_ms"); got != "lateness" {
		t.Errorf("legend of lateness_ms = %q", got)
	}
	if got := api.SpreadLabel("step_ms", "p95"); got != "Step, p95 of ranks" {
		t.Errorf("spread legend of step_ms = %q", got)
	}
}

const (
	stepDocsBegin = "<!-- step-fields: generated from api.StepFields by `go test ./api -run TestDocsListStepFields -update` -->\n"
	stepDocsEnd   = "<!-- end step-fields -->\n"
)

// stepDocsTable is docs/metrics.md's table of the step values.
func stepDocsTable() string {
	var b strings.Builder
	b.WriteString("| record field, column | unit | a bucket holds | legend | group |\n| --- | --- | --- | --- | --- |\n")
	for _, f := range api.StepFields {
		sum := map[api.StepSum]string{api.StepMean: "mean, min, max", api.StepCount: "the steps that set it", api.StepStored: "(not a series)"}[f.Sum]
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", f.Name, f.Unit, sum, f.Label, f.Group)
	}
	return b.String()
}

// docs/metrics.md lists every step value as the table defines it.
func TestDocsListStepFields(t *testing.T) {
	doc, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	s := string(doc)
	i, j := strings.Index(s, stepDocsBegin), strings.Index(s, stepDocsEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no generated step table between %q and %q", docsPath, stepDocsBegin, stepDocsEnd)
	}
	want := s[:i+len(stepDocsBegin)] + stepDocsTable() + s[j:]
	if *update {
		if err := os.WriteFile(docsPath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if s != want {
		t.Errorf("%s's step table differs from api.StepFields; run go test ./api -run TestDocsListStepFields -update", docsPath)
	}
}

// pyTuple reads the Python tuple NAME = (...) of src as its strings.
func pyTuple(t *testing.T, src, name string) []string {
	t.Helper()
	i := strings.Index(src, "\n"+name+" = (")
	if i < 0 {
		t.Fatalf("no %s tuple", name)
	}
	body := src[i+len(name)+5:]
	body = body[:strings.Index(body, ")")]
	var out []string
	for _, p := range strings.Split(body, ",") {
		if p = strings.Trim(strings.TrimSpace(p), `"`); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// The hook's list of step fields (hook/deepseed/records.py) is the step
// table's, its integer fields the table's counts.
func TestHookKnowsTheStepFields(t *testing.T) {
	const path = "../hook/deepseed/records.py"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	var want, wantInt []string
	for _, f := range api.StepFields {
		want = append(want, f.Name)
		if _, ok := f.Field(&api.Step{}).(**int64); ok {
			wantInt = append(wantInt, f.Name)
		}
	}
	for _, l := range []struct {
		name       string
		want, have []string
	}{{"STEP_FIELDS", want, pyTuple(t, src, "STEP_FIELDS")}, {"INT_FIELDS", wantInt, pyTuple(t, src, "INT_FIELDS")}} {
		slices.Sort(l.want)
		slices.Sort(l.have)
		if !slices.Equal(l.want, l.have) {
			t.Errorf("%s's %s = %v, the step table has %v", path, l.name, l.have, l.want)
		}
	}
}
