package stats_test

import (
	"fmt"

	"github.com/deepseed/deepseed/internal/stats"
)

func ExampleMedian() {
	steps := []float64{104, 98, 101, 250}
	fmt.Println(stats.Median(steps), steps)
	fmt.Println(stats.Median([]float64{3, 1, 2}))
	fmt.Println(stats.Median(nil))
	// Output:
	// 102.5 [104 98 101 250]
	// 2
	// NaN
}
