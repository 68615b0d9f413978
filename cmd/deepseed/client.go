package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/deepseed/deepseed/api"
)

// defaultServer is the server the client commands talk to unless told.
const defaultServer = "http://localhost:8080"

// addServerFlag defines --server, the server every client command talks
// to.
func addServerFlag(f *envFlags) *string {
	return f.String("server", "DEEPSEED_SERVER_URL", defaultServer, "DeepSeed server base URL, e.g. http://host:8080 (host:port alone means http://host:port)")
}

// serverURL reads --server: an http(s) URL, or host:port, taken as
// http://host:port.
func serverURL(s string) (*url.URL, error) {
	s = strings.TrimRight(strings.TrimSpace(s), "/")
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--server %q is not a server URL: write http://host:8080, https://host or host:8080", s)
	}
	return u, nil
}

// unreachable describes a request that got no answer in one line: what
// went wrong, in words, and what to check.
func unreachable(server string, err error) error {
	return fmt.Errorf("cannot reach the server at %s: %s; is deepseed serve running there? Give its URL with --server or DEEPSEED_SERVER_URL", server, netReason(err))
}

// netReason says in words why a request got no answer.
func netReason(err error) string {
	var dns *net.DNSError
	var op *net.OpError
	var ue *url.Error
	switch {
	case errors.As(err, &dns):
		return fmt.Sprintf("the host %q does not resolve", dns.Name)
	case errors.Is(err, syscall.ECONNREFUSED):
		return "nothing listens there (connection refused)"
	case errors.Is(err, context.DeadlineExceeded), os.IsTimeout(err):
		return "no answer in time"
	case errors.As(err, &op):
		return op.Err.Error()
	case errors.As(err, &ue):
		return ue.Err.Error()
	}
	return err.Error()
}

// apiFlags are the flags of the commands that talk to the server's job
// routes.
type apiFlags struct {
	server *string
	token  tokenFlag
	json   *bool
}

func addAPIFlags(f *envFlags, k tokenKind) apiFlags {
	return apiFlags{
		server: addServerFlag(f),
		token:  addTokenFlag(f, k),
		json:   f.Bool("json", "", false, "print the server's JSON answer instead of a table"),
	}
}

// call sends one request and decodes a 2xx answer into out; any other
// answer becomes an error carrying the server's message.
func (a apiFlags) call(ctx context.Context, method, path string, in, out any) error {
	base, err := serverURL(*a.server)
	if err != nil {
		return err
	}
	token, err := a.token.value()
	if err != nil {
		return err
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode the request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, base.String()+path, body)
	if err != nil {
		return fmt.Errorf("build the request: %w", err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return unreachable(base.String(), err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("read the server's answer: %w", err)
	}
	if res.StatusCode/100 != 2 {
		var e api.Error
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
		}
		if err := a.token.refused(base.String(), res.StatusCode, token != "", e.Error); err != nil {
			return err
		}
		return fmt.Errorf("%s (HTTP %d)", e.Error, res.StatusCode)
	}
	if *a.json {
		var buf bytes.Buffer
		if json.Indent(&buf, b, "", "  ") == nil {
			b = append(buf.Bytes(), '\n')
		}
		_, err := os.Stdout.Write(b)
		return err
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("decode the server's answer: %w", err)
		}
	}
	return nil
}

// noAgentWarning says, when no live agent serves project, that its
// queued jobs wait, and since when the last one that did was heard from;
// "" when one is alive or the agents cannot be read with this token.
func noAgentWarning(ctx context.Context, a apiFlags, project string) string {
	quiet := a
	quiet.json = new(bool)
	var l api.AgentList
	if quiet.call(ctx, http.MethodGet, "/api/v1/agents", nil, &l) != nil {
		return ""
	}
	var last *api.Agent
	for i, ag := range l.Agents {
		if len(ag.Projects) > 0 && !slices.Contains(ag.Projects, project) {
			continue
		}
		if ag.Alive {
			return ""
		}
		if last == nil || ag.LastHeartbeat.After(last.LastHeartbeat) {
			last = &l.Agents[i]
		}
	}
	if last == nil {
		return fmt.Sprintf("no agent serves project %s: its jobs wait in the queue until one runs (deepseed agent on a GPU node)", project)
	}
	return fmt.Sprintf("no live agent serves project %s: the last, %s, was last heard from at %s (%s ago); its jobs wait in the queue until one runs",
		project, last.Name, last.LastHeartbeat.UTC().Format(time.RFC3339), time.Since(last.LastHeartbeat).Round(time.Second))
}
