package detect

import (
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// phaseRow is one rank's phases at one step, milliseconds; the step is
// their sum plus host, so each row adds up as the hook's do.
type phaseRow struct {
	data, fwd, bwd, opt, host float64
	syncWait, commExposed     float64
}

// phaseRows builds n steps of each of ranks, newest first, from
// phases(rank, step) with up to ±jitter ms of noise on every phase.
// Every rank's step is the longest rank's (synchronous training): what a
// rank does not spend in a phase it spends waiting in syncWait, or, with
// hostBlocking, inside its forward, as gloo's host-blocking collectives do.
func phaseRows(ranks, n int, jitter float64, hostBlocking bool, phases func(rank, step int) phaseRow) map[int][]StepRow {
	rng := rand.New(rand.NewPCG(1, 2))
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	out := map[int][]StepRow{}
	for step := n; step >= 1; step-- {
		ph := make([]phaseRow, ranks)
		longest := 0.0
		for r := range ranks {
			p := phases(r, step)
			j := func(v float64) float64 { return math.Max(0, v+jitter*(2*rng.Float64()-1)) }
			p.data, p.fwd, p.bwd, p.opt, p.host = j(p.data), j(p.fwd), j(p.bwd), j(p.opt), j(p.host)
			ph[r] = p
			longest = math.Max(longest, p.data+p.fwd+p.bwd+p.opt+p.host+p.syncWait+p.commExposed)
		}
		for r, p := range ph {
			total := p.data + p.fwd + p.bwd + p.opt + p.host + p.syncWait + p.commExposed
			if hostBlocking {
				p.fwd += longest - total
			} else {
				p.syncWait += longest - total
			}
			row := StepRow{Rank: r, Step: int64(step), Time: t0.Add(time.Duration(step) * 100 * time.Millisecond),
				StepMS: f(longest), DataMS: f(p.data), ForwardMS: f(p.fwd), BackwardMS: f(p.bwd), OptimizerMS: f(p.opt)}
			if !hostBlocking { // the collective's wait is measured
				row.SyncWaitMS = f(p.syncWait + 0.1)
			}
			if p.commExposed > 0 {
				row.CommExposedMS = f(p.commExposed)
			}
			out[r] = append(out[r], row)
		}
	}
	return out
}

// wantOwn checks that exactly the ranks of want are own-work stragglers
// at the default threshold, each with its cause.
func wantOwn(t *testing.T, o OwnWork, want map[int]string) {
	t.Helper()
	got := o.Stragglers(Defaults().StragglerPct)
	if !slices.Equal(got, slices.Sorted(maps.Keys(want))) {
		t.Fatalf("own-work stragglers %v, want %v; figures %+v", got, slices.Sorted(maps.Keys(want)), o.Ranks)
	}
	for r, cause := range want {
		if o.Ranks[r].Cause != cause {
			t.Errorf("rank %d cause %q, want %q (%+v)", r, o.Ranks[r].Cause, cause, o.Ranks[r])
		}
	}
}

// DDP over gloo, rank 1's input 40 ms late every step (the issue's
// measurement: forward 48.3 ms on rank 0 against 8.0 on rank 1, data 41
// against 0.6, nobody late at the collective): rank 1 is named with cause
// data, and rank 0's 40 ms of forward read as its wait for rank 1.
func TestOwnWorkNamesTheDataStragglerUnderHostBlockingCollectives(t *testing.T) {
	rows := phaseRows(2, 60, 0.5, true, func(r, _ int) phaseRow {
		p := phaseRow{data: 0.6, fwd: 8, bwd: 30, opt: 5, host: 5}
		if r == 1 {
			p.data = 41
		}
		return p
	})
	if fwd0, fwd1 := *rows[0][0].ForwardMS, *rows[1][0].ForwardMS; fwd0 < fwd1+35 {
		t.Fatalf("fixture: rank 0's forward %.1f should hold its 40 ms wait (rank 1's %.1f)", fwd0, fwd1)
	}
	// Lateness cannot see it: no arrivals, no waits.
	if s := SyncSteps(rows, 50); len(s) != 0 {
		t.Fatalf("fixture has lateness at %d steps", len(s))
	}
	o := OwnWorkOf(rows, 50)
	if o.Steps != 50 {
		t.Fatalf("steps %d, want 50", o.Steps)
	}
	wantOwn(t, o, map[int]string{1: CauseData})
	if d := o.Ranks[1].DataMS; math.Abs(d-40.4) > 2 {
		t.Errorf("rank 1 data excess %.1f ms, want about 40.4", d)
	}
	if w := o.Ranks[0].HiddenWaitMS; math.Abs(w-40) > 3 {
		t.Errorf("rank 0 hidden wait %.1f ms, want about 40", w)
	}
	if e := o.Ranks[0].ExcessMS; e > 2 {
		t.Errorf("rank 0, which waits, has own excess %.1f ms", e)
	}
}

// Eight ranks over gloo, rank 5's input late: the median rank is one that
// waits, and still rank 5 alone is named and the others' wait is seen.
func TestOwnWorkNamesTheDataStragglerAmongManyWaiters(t *testing.T) {
	rows := phaseRows(8, 60, 0.5, true, func(r, _ int) phaseRow {
		p := phaseRow{data: 0.6, fwd: 8, bwd: 30, opt: 5, host: 5}
		if r == 5 {
			p.data = 30
		}
		return p
	})
	o := OwnWorkOf(rows, 50)
	wantOwn(t, o, map[int]string{5: CauseData})
	for r := range 8 {
		if w := o.Ranks[r].HiddenWaitMS; r != 5 && math.Abs(w-29.4) > 3 {
			t.Errorf("rank %d hidden wait %.1f ms, want about 29.4", r, w)
		}
	}
}

// DDP over gloo, rank 1 sleeping 40 ms after its backward: named with
// cause host.
func TestOwnWorkNamesAHostStraggler(t *testing.T) {
	rows := phaseRows(2, 60, 0.5, true, func(r, _ int) phaseRow {
		p := phaseRow{data: 0.6, fwd: 8, bwd: 30, opt: 5, host: 5}
		if r == 1 {
			p.host += 40
		}
		return p
	})
	wantOwn(t, OwnWorkOf(rows, 50), map[int]string{1: CauseHost})
}

// FSDP2 over gloo on four ranks, rank 2's input 40 ms late: the others'
// waits hide in their forward beside a little exposed communication.
func TestOwnWorkNamesAnFSDPDataStraggler(t *testing.T) {
	rows := phaseRows(4, 60, 2, true, func(r, _ int) phaseRow {
		p := phaseRow{data: 0.6, fwd: 108.8, bwd: 150, opt: 10, host: 3, commExposed: 2.1}
		if r == 2 {
			p.data = 41
		}
		return p
	})
	wantOwn(t, OwnWorkOf(rows, 50), map[int]string{2: CauseData})
}

// The control: equal ranks with noise name nobody.
func TestOwnWorkControlNamesNobody(t *testing.T) {
	for _, blocking := range []bool{false, true} {
		rows := phaseRows(4, 60, 2, blocking, func(int, int) phaseRow {
			return phaseRow{data: 0.6, fwd: 8, bwd: 30, opt: 5, host: 2}
		})
		wantOwn(t, OwnWorkOf(rows, 50), nil)
	}
}

// One slow step (a collection pause) is not a straggler: the figures are
// medians over the steps.
func TestOwnWorkIgnoresAnOccasionalSlowStep(t *testing.T) {
	rows := phaseRows(2, 60, 0.5, true, func(r, step int) phaseRow {
		p := phaseRow{data: 0.6, fwd: 8, bwd: 30, opt: 5, host: 2}
		if r == 1 && step%5 == 0 {
			p.host += 200
		}
		return p
	})
	wantOwn(t, OwnWorkOf(rows, 50), nil)
}

// NCCL, where the waits are measured (sync_wait_ms) and lateness already
// names the slow rank: own work names the same rank with its cause, and
// the waiters' measured waits are not taken for host time.
func TestOwnWorkAgreesWithLatenessUnderNCCL(t *testing.T) {
	for cause, slow := range map[string]func(*phaseRow){
		CauseGPU:  func(p *phaseRow) { p.bwd += 25 },
		CauseData: func(p *phaseRow) { p.data += 25 },
		CauseHost: func(p *phaseRow) { p.host += 25 },
	} {
		rows := phaseRows(8, 60, 0.5, false, func(r, _ int) phaseRow {
			p := phaseRow{data: 0.6, fwd: 20, bwd: 40, opt: 5, host: 2}
			if r == 3 {
				slow(&p)
			}
			return p
		})
		o := OwnWorkOf(rows, 50)
		wantOwn(t, o, map[int]string{3: cause})
		// Lateness from the waits names rank 3 too.
		scores := FinalScores(rows, Defaults())
		for r, s := range scores {
			if (s > Defaults().StragglerPct/100) != (r == 3) {
				t.Errorf("%s: rank %d lateness score %.3f", cause, r, s)
			}
		}
		if len(scores) != 8 {
			t.Errorf("%s: lateness scores %v", cause, scores)
		}
	}
}

// Rows without phases (a sender that gives step times alone) give no
// own-work figures, so the signal stays silent.
func TestOwnWorkNeedsPhases(t *testing.T) {
	o := OwnWorkOf(syncRows(4, 60, func(int, int) float64 { return 0 }, func(int) float64 { return 0 }), 50)
	if o.Steps != 0 || o.Ranks != nil || o.Stragglers(10) != nil {
		t.Fatalf("own work of rows without phases: %+v", o)
	}
}

func TestLeaveOneOutExcess(t *testing.T) {
	got := looExcess([]float64{1, 5, math.NaN(), 2, 10})
	want := []float64{1 - 5, 5 - 2, math.NaN(), 2 - 5, 10 - 2} // the others' medians: 5, 2, 5, 2
	for i := range want {
		if math.IsNaN(want[i]) != math.IsNaN(got[i]) || (!math.IsNaN(want[i]) && math.Abs(got[i]-want[i]) > 1e-12) {
			t.Fatalf("looExcess = %v, want %v", got, want)
		}
	}
}

// Ranks doing the same work read 0 ms of own excess, not the 2e-16 ms that
// the float differences of their identical phases leave; a real excess
// keeps the four decimals of a millisecond the hook sends.
func TestOwnExcessOfEqualRanksIsZero(t *testing.T) {
	rows := phaseRows(8, 40, 0, true, func(r, _ int) phaseRow {
		// The same 0.3 ms, as two float sums that differ in the last bit.
		p := phaseRow{data: 0.3, fwd: 8.3, bwd: 30.7, opt: 5.1, host: 2.3}
		if r%2 == 1 {
			a, b := 0.1, 0.2
			p.data = a + b
		}
		if r == 5 {
			p.data += 12.34567
		}
		return p
	})
	o := OwnWorkOf(rows, 30)
	for r, x := range o.Ranks {
		if r == 5 {
			if math.Abs(x.ExcessMS-12.3457) > 1e-9 || math.Abs(x.DataMS-12.3457) > 1e-9 {
				t.Errorf("rank 5: excess %v, data %v ms; want 12.3457 (the precision sent)", x.ExcessMS, x.DataMS)
			}
			continue
		}
		for name, v := range map[string]float64{"excess": x.ExcessMS, "data": x.DataMS, "host": x.HostMS, "gpu": x.GPUMS} {
			if v != 0 {
				t.Errorf("rank %d: %s %g ms, want exactly 0", r, name, v)
			}
		}
	}
}
