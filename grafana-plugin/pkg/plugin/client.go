package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/deepseed/deepseed/api"
)

// maxResponseBytes bounds one answer of the query service; series and
// heatmaps are downsampled on the server, so real answers stay far below.
const maxResponseBytes = 256 << 20

// client calls the DeepSeed query service.
type client struct {
	base  string // server URL without the trailing slash
	token string
	http  *http.Client
}

// HTTPError is a non-2xx answer of the DeepSeed server.
type HTTPError struct {
	Status int
	Msg    string // the server's error message, or the status text
	Param  string // the query parameter the server names, for 400s
}

func (e *HTTPError) Error() string {
	if e.Param != "" {
		return fmt.Sprintf("deepseed server: %d: %s (parameter %s)", e.Status, e.Msg, e.Param)
	}
	return fmt.Sprintf("deepseed server: %d: %s", e.Status, e.Msg)
}

// get fetches base + path with params and decodes the JSON answer into out.
// path starts with "/", e.g. "/api/v1/runs".
func (c *client) get(ctx context.Context, path string, params url.Values, out any) error {
	u := c.base + path
	if len(params) > 0 {
		u += "?" + params.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("deepseed request %s: %w", path, err)
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" && strings.HasPrefix(path, "/api/") {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("deepseed request %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return fmt.Errorf("deepseed read %s: %w", path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		he := &HTTPError{Status: resp.StatusCode, Msg: http.StatusText(resp.StatusCode)}
		var e api.Error
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			he.Msg, he.Param = e.Error, e.Param
		}
		return he
	}
	if out == nil {
		return nil
	}
	// The server writes non-finite numbers as strings; normalising also
	// takes bare NaN tokens should a proxy or older server send them.
	if err := json.Unmarshal(api.NormalizeJSON(body), out); err != nil {
		return fmt.Errorf("deepseed decode %s: %w", path, err)
	}
	return nil
}

// httpStatus returns the status of an HTTPError in err's chain, or 0.
func httpStatus(err error) int {
	var he *HTTPError
	if errors.As(err, &he) {
		return he.Status
	}
	return 0
}

func runPath(runID, sub string) string {
	p := "/api/v1/runs/" + url.PathEscape(runID)
	if sub != "" {
		p += "/" + sub
	}
	return p
}
