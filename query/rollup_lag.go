package query

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// Headers that say, on every answer that read rollups, how far they are
// behind the raw rows (api.RollupLag): the oldest waiting block's wait in
// seconds and the rank-blocks waiting, over the runs the answer read.
const (
	RollupLagHeader       = "X-DeepSeed-Rollup-Lag"
	RollupLagBlocksHeader = "X-DeepSeed-Rollup-Lag-Blocks"
)

// Bounds of a read's own refresh: a read refreshes a backlog of at most
// readRefreshBlocks markers, within Options.RefreshBudget
// (defaultRefreshBudget), and waits at most readLockWait, once a request,
// for a refresh of the run under way elsewhere (the background
// refresher's, another read's). Whatever it leaves, it answers from the rollups as they are
// and says how far behind they are.
const (
	readRefreshBlocks    = 1000
	defaultRefreshBudget = 10 * time.Second
	readLockWait         = time.Second
)

// lagNote collects the rollup backlogs of the runs one request read.
type lagNote struct {
	mu     sync.Mutex
	runs   map[string]store.RollupBacklog
	waited bool // the request has had its wait for a refresh lock
}

// firstLockWait reports whether the request of ctx may still wait for a
// run's refresh lock (once a request), and uses its wait up.
func firstLockWait(ctx context.Context) bool {
	n, _ := ctx.Value(lagNoteKey{}).(*lagNote)
	if n == nil {
		return true
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	first := !n.waited
	n.waited = true
	return first
}

type lagNoteKey struct{}

// withLagNote returns ctx carrying a new lagNote.
func withLagNote(ctx context.Context) (context.Context, *lagNote) {
	n := &lagNote{runs: map[string]store.RollupBacklog{}}
	return context.WithValue(ctx, lagNoteKey{}, n), n
}

// noteBacklog records runID's backlog in ctx's lagNote, if any.
func noteBacklog(ctx context.Context, runID string, b store.RollupBacklog) {
	if n, _ := ctx.Value(lagNoteKey{}).(*lagNote); n != nil {
		n.mu.Lock()
		n.runs[runID] = b
		n.mu.Unlock()
	}
}

// rollupLag is the lag of runID's rollups noted in ctx, nil when they
// were up to date (or not read).
func rollupLag(ctx context.Context, runID string) *api.RollupLag {
	n, _ := ctx.Value(lagNoteKey{}).(*lagNote)
	if n == nil {
		return nil
	}
	n.mu.Lock()
	b, ok := n.runs[runID]
	n.mu.Unlock()
	if !ok || b.Blocks == 0 {
		return nil
	}
	return &api.RollupLag{Blocks: b.Blocks, BehindS: api.Float(b.Behind(time.Now()).Seconds())}
}

// setHeaders writes the lag headers when the request read rollups.
func (n *lagNote) setHeaders(c echo.Context) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.runs) == 0 {
		return
	}
	var blocks int64
	var behind time.Duration
	now := time.Now()
	for _, b := range n.runs {
		blocks += b.Blocks
		behind = max(behind, b.Behind(now))
	}
	c.Response().Header().Set(RollupLagHeader, strconv.FormatFloat(behind.Seconds(), 'f', 3, 64))
	c.Response().Header().Set(RollupLagBlocksHeader, strconv.FormatInt(blocks, 10))
}
