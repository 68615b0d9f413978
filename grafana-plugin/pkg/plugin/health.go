package plugin

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/grafana/grafana-plugin-sdk-go/backend"

	"github.com/deepseed/deepseed/api"
)

// CheckHealth backs "Save & test": first the server's /readyz (is it
// there, with its database?), then an authenticated GET /api/v1/runs (is
// the token accepted?); the message says which of the two failed.
func (d *Datasource) CheckHealth(ctx context.Context, _ *backend.CheckHealthRequest) (*backend.CheckHealthResult, error) {
	if err := d.client.get(ctx, "/readyz", nil, nil); err != nil {
		msg := fmt.Sprintf("DeepSeed server at %s is not ready: %v", d.settings.URL, err)
		if httpStatus(err) == 0 {
			msg = fmt.Sprintf("DeepSeed server at %s is unreachable: %v", d.settings.URL, err)
		}
		return &backend.CheckHealthResult{Status: backend.HealthStatusError, Message: msg}, nil
	}
	var page api.RunList
	err := d.client.get(ctx, "/api/v1/runs", url.Values{"limit": {"1"}}, &page)
	switch s := httpStatus(err); {
	case err == nil:
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		msg := "The DeepSeed server rejected the token: set a read token of the server in the data source's settings"
		if d.settings.Secrets.Token == "" {
			msg = "The DeepSeed server requires a token: set a read token in the data source's settings"
		}
		return &backend.CheckHealthResult{Status: backend.HealthStatusError, Message: msg}, nil
	default:
		return &backend.CheckHealthResult{Status: backend.HealthStatusError,
			Message: fmt.Sprintf("DeepSeed server is ready but listing runs failed: %v", err)}, nil
	}
	return &backend.CheckHealthResult{
		Status:  backend.HealthStatusOk,
		Message: fmt.Sprintf("Connected to DeepSeed: server ready, token accepted, %d runs", page.Total),
	}, nil
}
