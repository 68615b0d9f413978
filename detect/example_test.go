package detect_test

import (
	"fmt"
	"math"
	"time"

	"github.com/deepseed/deepseed/detect"
)

// The detectors are pure functions over the rows the evaluator read of one
// run: here two ranks' newest steps, newest first, in which rank 1's loss
// went NaN at step 98 and stayed so. Run goes through detect.Table and
// returns what fires; the evaluator stores it in the alerts table.
func ExampleRun() {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	steps := func(rank int, nanFrom int64) []detect.StepRow {
		var rows []detect.StepRow
		for s := int64(100); s > 0; s-- {
			loss, ms := 2.0-float64(s)/100, 200.0
			if nanFrom > 0 && s >= nanFrom {
				loss = math.NaN()
			}
			rows = append(rows, detect.StepRow{Rank: rank, Step: s, Time: t0.Add(time.Duration(s) * 200 * time.Millisecond),
				Loss: &loss, StepMS: &ms})
		}
		return rows
	}
	in := detect.Rows{
		Steps:   map[int][]detect.StepRow{0: steps(0, 0), 1: steps(1, 98)},
		Running: true,
		Now:     t0.Add(21 * time.Second),
	}
	for _, f := range detect.Run(detect.Defaults(), in) {
		fmt.Println(f.Kind+":", f.Text)
	}
	// Output:
	// non_finite: non-finite loss (NaN) at step 98 on rank 1
}
