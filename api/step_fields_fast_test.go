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
