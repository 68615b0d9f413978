package fleettest

import (
	"fmt"
	"time"

	"github.com/deepseed/deepseed/api"
)

// layerNames are a model's layers in the order the hook reports them:
// first, the blocks block.0 … block.<blocks-1>, then last.
func layerNames(first, block string, blocks int, last ...string) []string {
	names := make([]string, 0, 1+max(blocks, 0)+len(last))
	names = append(names, first)
	for i := range blocks {
		names = append(names, fmt.Sprintf("%s.%d", block, i))
	}
	return append(names, last...)
}

// namedLayers are n layers in all: the embeddings, the blocks and the
// head (one layer: the embeddings alone).
func namedLayers(n int, block, head string) []string {
	return layerNames("embeddings", block, n-2, head)[:n]
}

// layersRecord is the layers record of rank at step, sent at t: each
// layer's forward and backward milliseconds as timing returns them, asked
// layer by layer in model order (so that a seeded timing draws its noise
// in that order).
func layersRecord(runID string, rank int, step int64, t time.Time, names []string,
	timing func(layer int) (fwd, bwd float64)) *api.Layers {
	fwd := make([]api.Float, len(names))
	bwd := make([]api.Float, len(names))
	for i := range names {
		f, b := timing(i)
		fwd[i], bwd[i] = api.Float(f), api.Float(b)
	}
	return &api.Layers{Kind: api.KindLayers, RunID: runID, Rank: rank, Step: api.Ptr(step), Time: api.T(t),
		Names: names, ForwardMS: fwd, BackwardMS: bwd}
}
