package api

import (
	"fmt"
	"testing"
)

// The fast decoder's hand-written switch knows every value of the step
// table: a step carrying any one of them takes the fast path, and the
// value lands in the table's field, as the general path puts it.
func TestFastDecoderKnowsEveryStepField(t *testing.T) {
	for _, f := range StepFields {
		lit := "3"
		if _, flag := f.Field(&Step{}).(**bool); flag {
			lit = "true"
		}
		line := fmt.Sprintf(`{"kind":"step","run_id":"r","rank":1,"step":9,%q:%s}`, f.Name, lit)
		var fd fastDecoder
		rec, ok := fd.record([]byte(line))
		if !ok || rec.Step == nil {
			t.Errorf("%s: the fast path gave up; add its case to fastDecoder's step switch", f.Name)
			continue
		}
		switch p := f.Field(rec.Step).(type) {
		case **Float:
			ok = *p != nil && **p == 3
		case **int64:
			ok = *p != nil && **p == 3
		case **bool:
			ok = *p != nil && **p
		}
		if !ok {
			t.Errorf("%s: the fast path did not fill the table's field", f.Name)
		}
		checkSameAsGeneral(t, []byte(line))
	}
}

// A step carrying every value of the table at once decodes as the
// general path decodes it: the fast path has a slot for each of its
// floats, so the record that sends all of them is not the one it fails
// on.
func TestFastDecoderTakesEveryStepFieldAtOnce(t *testing.T) {
	line := everyStepFieldLine()
	floats := 0
	for _, f := range StepFields {
		if _, ok := f.Field(&Step{}).(**Float); ok {
			floats++
		}
	}
	if floats > stepFloatSlots {
		t.Fatalf("%d float values in the table, %d slots in the fast decoder's step box: raise stepFloatSlots", floats, stepFloatSlots)
	}
	var fd fastDecoder
	rec, ok := fd.record([]byte(line))
	if !ok || rec.Step == nil {
		t.Fatal("the fast path gave up on a step with every value")
	}
	for i, f := range StepFields {
		if p, isFloat := f.Field(rec.Step).(**Float); isFloat && (*p == nil || float64(**p) != float64(i+1)+0.5) {
			t.Errorf("%s: %v, want %d.5", f.Name, *p, i+1)
		}
	}
	checkSameAsGeneral(t, []byte(line))
}

// everyStepFieldLine is a step record carrying every value of the table:
// flags true, counts and floats numbered by their row (i+1, i+1.5).
func everyStepFieldLine() string {
	line := `{"kind":"step","run_id":"r","rank":1,"step":9`
	for i, f := range StepFields {
		switch f.Field(&Step{}).(type) {
		case **bool:
			line += fmt.Sprintf(`,%q:true`, f.Name)
		case **int64:
			line += fmt.Sprintf(`,%q:%d`, f.Name, i+1)
		default:
			line += fmt.Sprintf(`,%q:%d.5`, f.Name, i+1)
		}
	}
	line += "}"
	return line
}
