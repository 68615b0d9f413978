// Package ingest serves POST /api/v1/ingest and POST /api/v1/import:
// decode, validate, and hand whole batches to the store.
package ingest

import (
	"log/slog"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/store"
)

// Options configures the ingest handlers.
type Options struct {
	// MaxBodyBytes bounds a request body after decompression; 0 means 32 MiB.
	MaxBodyBytes int64
	Logger       *slog.Logger
}

// Handler serves the ingest routes.
type Handler struct {
	store *store.Store
	opt   Options
}

// New returns the ingest handlers over s.
func New(s *store.Store, opt Options) *Handler { return &Handler{store: s, opt: opt} }

// Register adds POST /ingest and POST /import to g (mounted at /api/v1).
func (h *Handler) Register(g *echo.Group) {}
