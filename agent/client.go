package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/deepseed/deepseed/api"
)

// client speaks to the server's agent routes with an agent token.
type client struct {
	base  string // server URL, no trailing slash
	token string
	name  string
	http  *http.Client
}

// StatusError is an answer of the server other than 2xx.
type StatusError struct {
	Code int
	Msg  string
}

func (e *StatusError) Error() string { return fmt.Sprintf("server answered %d: %s", e.Code, e.Msg) }

func (c *client) post(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	res, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 8<<20))
	if err != nil {
		return fmt.Errorf("read answer of %s: %w", path, err)
	}
	if res.StatusCode/100 != 2 {
		var e api.Error
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		return &StatusError{Code: res.StatusCode, Msg: msg}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decode answer of %s: %w", path, err)
	}
	return nil
}

func (c *client) agentPath(rest string) string {
	return "/api/v1/agents/" + url.PathEscape(c.name) + rest
}

func (c *client) heartbeat(ctx context.Context, hb api.AgentHeartbeat) (api.AgentHeartbeatReply, error) {
	var r api.AgentHeartbeatReply
	err := c.post(ctx, c.agentPath("/heartbeat"), hb, &r)
	return r, err
}

func (c *client) claim(ctx context.Context, in api.AgentClaim) (api.AgentClaimReply, error) {
	var r api.AgentClaimReply
	err := c.post(ctx, c.agentPath("/claim"), in, &r)
	return r, err
}

func (c *client) report(ctx context.Context, id int64, r api.JobReport) error {
	return c.post(ctx, c.agentPath("/jobs/"+strconv.FormatInt(id, 10)), r, nil)
}
