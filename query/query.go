// Package query serves the read API under /api/v1 and holds the
// computations behind every chart: downsampling, heatmap buckets,
// steady-state windows, breakdowns and comparisons.
package query

import (
	"log/slog"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/store"
)

// Options configures the query handlers.
type Options struct {
	Logger *slog.Logger
	// StragglerPct is the default margin over the median step time past
	// which a rank is flagged as a straggler; 0 means 10.
	StragglerPct float64
}

// Handler serves the query routes.
type Handler struct {
	store *store.Store
	opt   Options
}

// New returns the query handlers over s.
func New(s *store.Store, opt Options) *Handler { return &Handler{store: s, opt: opt} }

// Register adds the GET routes to g (mounted at /api/v1).
func (h *Handler) Register(g *echo.Group) {}
