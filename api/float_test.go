package api_test

import (
	"encoding/json"
	"testing"

	"github.com/deepseed/deepseed/api"
)

// Whole numbers encode as integers, others as before, non-finite values as
// strings.
func TestFloatEncodesWholeNumbersAsIntegers(t *testing.T) {
	for v, want := range map[float64]string{4022000000: "4022000000", 0.5: "0.5", 1e21: "1e+21", 1.5e-7: "1.5e-07",
		-3: "-3", 4022000000.0000005: "4.0220000000000005e+09"} {
		b, err := json.Marshal(api.Float(v))
		if err != nil || string(b) != want {
			t.Errorf("Float(%v) = %s (%v), want %s", v, b, err, want)
		}
	}
}
