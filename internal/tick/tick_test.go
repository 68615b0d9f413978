package tick_test

import (
	"context"
	"testing"
	"time"

	"github.com/deepseed/deepseed/internal/tick"
)

// A pass that reports more work is followed at once by the next one, so
// three passes run well inside an interval of an hour; the loop returns
// once its context is done, after the pass in progress.
func TestLoopGoesOnWhileWorkIsLeft(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	passes := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick.Loop(ctx, time.Hour, true, func(context.Context) bool {
			passes++
			if passes == 3 {
				cancel()
			}
			return true
		})
	}()
	<-done
	if passes != 3 {
		t.Errorf("%d passes, want 3: the loop went on after its context was done", passes)
	}
}

// Without work left and without now, no pass runs before the interval:
// with an interval of an hour, none runs before the context ends.
func TestLoopWaitsTheInterval(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	ran := false
	tick.Loop(ctx, time.Hour, false, func(context.Context) bool { ran = true; return false })
	if ran {
		t.Error("a pass ran before the first interval")
	}
}
