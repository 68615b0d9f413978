// Package stats holds the small statistics that several packages compute
// the same way: the query API's steady-state windows and rank tables, the
// detectors' thresholds and the benchmarks' reports.
package stats

import (
	"math"
	"slices"
)

// Median returns the median of v, NaN when v is empty; v is not changed.
// An even count gives the mean of the two middle values.
func Median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return math.NaN()
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
