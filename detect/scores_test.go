package detect

import (
	"math"
	"testing"
)

// Scores from rollups (one update a block of steps) reach what the steps
// would have given: rank 1, 30 ms late on a 100 ms median busy time,
// scores 0.3; a rank arriving first scores 0.
func TestBlockScoresMatchTheStepDefinition(t *testing.T) {
	var blocks []ScoreBlock
	for b := int64(0); b < 5; b++ {
		blocks = append(blocks, ScoreBlock{FirstStep: b * 100, Steps: 100,
			Late: map[int]float64{0: 0, 1: 30, 2: 0}, Busy: map[int]float64{0: 100, 1: 100, 2: 90}})
	}
	pts := BlockScores(blocks, Defaults())
	if len(pts) != 15 {
		t.Fatalf("%d scores, want 3 ranks × 5 blocks", len(pts))
	}
	last := map[int]float64{}
	for _, p := range pts {
		last[p.Rank] = p.Score
	}
	if last[0] != 0 || last[2] != 0 || math.Abs(last[1]-0.3) > 1e-9 {
		t.Errorf("final scores %v, want rank 1 at 0.3 and the others at 0", last)
	}
	// A block of 100 steps weighs as its steps would have: after a change,
	// one block moves the score nearly all the way ((1 − 0.1)^100 ≈ 0).
	blocks = append(blocks, ScoreBlock{FirstStep: 500, Steps: 100,
		Late: map[int]float64{0: 0, 1: 0, 2: 0}, Busy: map[int]float64{0: 100, 1: 100, 2: 100}})
	pts = BlockScores(blocks, Defaults())
	if s := pts[len(pts)-2].Score; pts[len(pts)-2].Rank != 1 || s > 1e-3 {
		t.Errorf("rank 1 after a block on time: %v, want near 0", s)
	}
}
