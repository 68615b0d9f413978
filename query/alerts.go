package query

import (
	"context"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// alerts answers GET /api/v1/alerts: the detectors' alerts, the newest
// opened first, filtered by project, run_id, state (open or resolved) and
// kind.
func (h *Handler) alerts(ctx context.Context, c echo.Context) (any, error) {
	f := store.AlertFilter{
		Project: c.QueryParam("project"),
		RunID:   c.QueryParam("run_id"),
		State:   c.QueryParam("state"),
		Kind:    c.QueryParam("kind"),
	}
	for name, v := range map[string]string{"project": f.Project, "run_id": f.RunID} {
		if len(v) > api.MaxIDLen {
			return nil, bad(name, "longer than %d bytes", api.MaxIDLen)
		}
	}
	if f.State != "" && f.State != "open" && f.State != "resolved" {
		return nil, bad("state", "%q is not open or resolved", f.State)
	}
	if f.Kind != "" && !slices.Contains(api.AlertKinds, f.Kind) {
		return nil, bad("kind", "%q is not one of %s", f.Kind, strings.Join(api.AlertKinds, ", "))
	}
	limit, err := intParam(c, "limit", 100, 1, 1000)
	if err != nil {
		return nil, err
	}
	f.Limit = int(limit)
	list, err := h.store.Alerts(ctx, f)
	if err != nil {
		return nil, err
	}
	return api.AlertList{Alerts: list, Limit: f.Limit}, nil
}
