package alerts

import (
	"context"
	"fmt"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/detect"
)

// Trends computes what the regression and drift detectors read of a run:
// its comparison with its baseline runs and its step blocks with GPU
// windows. The query server implements it (query.Handler); a nil Trends
// leaves both detectors quiet.
type Trends interface {
	Regression(ctx context.Context, runID string, cfg detect.Config) (*api.Regression, error)
	DriftInput(ctx context.Context, runID string, cfg detect.Config) (*detect.DriftInput, error)
}

// TrendsEvery is how often a run's trends are recomputed: they read a
// few hundred rollup rows a run and its baseline's, so a pass reuses the
// last ones in between.
const TrendsEvery = time.Minute

type trendEntry struct {
	at         time.Time
	regression *api.Regression
	drift      *detect.DriftInput
}

// trends returns the run's trends, recomputed when older than TrendsEvery.
func (e *Evaluator) trends(ctx context.Context, runID string, running bool, cfg detect.Config) (*api.Regression, *detect.DriftInput, error) {
	if e.Trends == nil {
		return nil, nil, nil
	}
	now := e.now()
	if c, ok := e.trendCache[runID]; ok && now.Sub(c.at) < TrendsEvery {
		return c.regression, c.drift, nil
	}
	reg, err := e.Trends.Regression(ctx, runID, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("alerts: regression of %s: %w", runID, err)
	}
	var drift *detect.DriftInput
	if running {
		if drift, err = e.Trends.DriftInput(ctx, runID, cfg); err != nil {
			return nil, nil, fmt.Errorf("alerts: drift of %s: %w", runID, err)
		}
	}
	if e.trendCache == nil {
		e.trendCache = map[string]trendEntry{}
	}
	for id, c := range e.trendCache {
		if now.Sub(c.at) > 10*TrendsEvery {
			delete(e.trendCache, id)
		}
	}
	e.trendCache[runID] = trendEntry{at: now, regression: reg, drift: drift}
	return reg, drift, nil
}
