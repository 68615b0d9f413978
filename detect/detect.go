// Package detect holds the server's detectors as pure functions over the
// rows a run has stored: each takes the thresholds (Config) and what the
// evaluator read of one run (Rows) and returns what fires, touching
// neither the database nor the clock. Table lists them with what their
// Grafana alert rules say; the evaluator (package alerts) runs them all
// with Run, and the dashboards generator writes Grafana's rules from it.
//
// Beside the detectors it holds the straggler score (SyncSteps,
// StragglerScores), which the evaluator stores for a running run and the
// query server computes on read for a run the evaluator never scored
// (FinalScores, ScoreSeries, BlockScores); ByRank groups the store's step
// rows as all of them take them.
//
// Adding a detector is a file here with its function and a line in Table,
// its kind in api.AlertKinds and the API document, the Grafana rules
// regenerated (go run ./dashboards/gen), and, when it needs rows no
// detector reads yet, a field of Rows that the evaluator fills.
//
// The package depends on no database code, so that the dashboards can
// use its table and defaults without pulling in the store.
package detect

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/deepseed/deepseed/api"
)

// StepRow is one step of one rank as the detectors read it (the store's
// reads of the steps table answer them); the columns a record left out are
// nil (loss, grad norm, times) or false.
type StepRow struct {
	Rank       int
	Step       int64
	Time       time.Time
	Loss       *float64
	GradNorm   *float64
	LossScale  *float64
	Skipped    bool
	StepMS     *float64
	DataMS     *float64
	SyncNS     *int64
	SyncWaitMS *float64
	// The phases the own-work signal splits a step into (OwnWorkOf).
	ForwardMS, BackwardMS, OptimizerMS *float64
	CommExposedMS, InputWaitMS         *float64
}

// ByRank groups step rows by rank, each rank's in the order given, as
// Rows.Steps and the scores take them.
func ByRank(rows []StepRow) map[int][]StepRow {
	out := map[int][]StepRow{}
	for _, s := range rows {
		out[s.Rank] = append(out[s.Rank], s)
	}
	return out
}

// GPUState is a GPU's recent samples as the idle detector reads them.
type GPUState struct {
	Host      string
	GPU       int
	Rank      *int
	Last      time.Time // newest sample
	IdleSince time.Time // the oldest sample after the last busy one
	LastUtil  float64
}

// Rows is what the evaluator read of one run for one pass: the input of
// every detector.
type Rows struct {
	// Steps holds each rank's newest steps, newest first; a rank that
	// has a key has at least one step.
	Steps map[int][]StepRow
	// Running says whether the run is still running: the detectors of
	// absence (stalled, rank stopped, idle GPU) fire only then.
	Running bool
	// Now is the server's clock at the pass.
	Now time.Time
	// Scores holds each rank's newest straggler score, and Scored how
	// many steps were scored to get it (see StragglerScores).
	Scores map[int]RankScore
	Scored int
	// Hangs holds each rank's newest hang report newer than the run's
	// newest step.
	Hangs []HangReport
	// GPUs holds the run's GPUs' recent samples (read while it runs).
	GPUs []GPUState
	// Regression is the run's comparison with its baseline runs, nil
	// when it has none (or it was not computed on this pass); Drift the
	// run's step blocks and GPU windows, nil when not read.
	Regression *api.Regression
	Drift      *DriftInput
}

// ranks returns the ranks with steps, lowest first.
func (in Rows) ranks() []int {
	return slices.Sorted(maps.Keys(in.Steps))
}

// lead returns the lowest rank's steps, nil when there are none. The
// detectors of a run's optimizer and loss read it: every data parallel
// rank skips the same steps and sees the same loss.
func (in Rows) lead() []StepRow {
	if ranks := in.ranks(); len(ranks) > 0 {
		return in.Steps[ranks[0]]
	}
	return nil
}

// Firing is one detector's finding; (Kind, Subject) keys it in a run.
type Firing struct {
	Kind      string
	Subject   string
	Rank      *int
	Step      *int64
	Value     float64
	Threshold float64
	Text      string
	At        time.Time
}

func rankSubject(r int) string { return fmt.Sprintf("rank %d", r) }

func finite(p *float64) bool { return p == nil || (!math.IsNaN(*p) && !math.IsInf(*p, 0)) }
