// Package tick runs the server's background passes (the rollup refresher,
// the alert evaluator): one pass at a time, the next one an interval after
// the last one ended, until the context is done.
package tick

import (
	"context"
	"time"
)

// DefaultEvery is the interval Loop uses when given none.
const DefaultEvery = 5 * time.Second

// Loop calls pass until ctx is done. The first pass runs at once when now
// is true, else after every; each next one runs every after the previous
// one returned, or at once when it reported more work waiting. An every of
// zero or less means DefaultEvery. Loop returns when ctx is done, never
// during a pass (pass sees the same ctx).
func Loop(ctx context.Context, every time.Duration, now bool, pass func(ctx context.Context) (more bool)) {
	if every <= 0 {
		every = DefaultEvery
	}
	first := every
	if now {
		first = 0
	}
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil {
			return // a timer of 0 and a done context were both ready
		}
		wait := every
		if pass(ctx) {
			wait = 0
		}
		t.Reset(wait)
	}
}
