package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/jobs"
)

// Token scopes. Every scope may read; ingest may also write runs, submit
// may queue and cancel jobs and set quotas, agent may claim jobs and
// report on them.
const (
	ScopeRead   = "read"
	ScopeIngest = "ingest"
	ScopeSubmit = jobs.ScopeSubmit
	ScopeAgent  = jobs.ScopeAgent
)

// scopeOrder is the order scope answers in when a token is in several
// lists.
var scopeOrder = []string{ScopeIngest, ScopeSubmit, ScopeAgent, ScopeRead}

// authenticator checks bearer tokens. Tokens are kept as SHA-256 digests
// and compared in constant time against every configured token, so
// neither a token's content nor its length leaks through timing.
type authenticator struct {
	tokens map[string][][sha256.Size]byte // by scope
	agents []agentGrant                   // who each agent token may act as
}

// agentGrant binds an agent token to the agent names it may act as: one
// name, or every name that starts with prefix.
type agentGrant struct {
	name   string
	prefix bool
	digest [sha256.Size]byte
}

// ParseAgentToken reads one entry of DEEPSEED_AGENT_TOKENS: NAME:TOKEN
// binds TOKEN to the agent NAME (its --name), and PREFIX*:TOKEN to every
// agent whose name starts with PREFIX. The same token may be listed under
// several names. The error never holds the token.
func ParseAgentToken(entry string) (name string, prefix bool, token string, err error) {
	name, token, ok := strings.Cut(entry, ":")
	switch {
	case !ok || name == "":
		return "", false, "", errors.New("no agent name: write NAME:TOKEN, NAME being the agent's --name (or a prefix ending in *)")
	case token == "":
		return "", false, "", errors.New("an empty token after NAME:")
	}
	name, prefix = strings.CutSuffix(name, "*")
	if !jobs.ValidName(name) {
		// Not quoted back: the entry may be a token with a colon in it.
		return "", false, "", errors.New("what precedes the first ':' is not an agent name (letters, digits, '.', '_' and '-', at most 128, optionally ending in *): write NAME:TOKEN")
	}
	return name, prefix, token, nil
}

// addAgents configures the agent tokens, NAME:TOKEN each (see
// ParseAgentToken); Config.Validate reports a malformed entry, which is
// left out here.
func (a *authenticator) addAgents(entries []string) {
	for _, e := range entries {
		name, prefix, token, err := ParseAgentToken(e)
		if err != nil {
			continue
		}
		d := sha256.Sum256([]byte(token))
		a.tokens[ScopeAgent] = append(a.tokens[ScopeAgent], d)
		a.agents = append(a.agents, agentGrant{name: name, prefix: prefix, digest: d})
	}
}

// agentNames returns the names (a prefix ending in *) token may act as,
// and whether one of them is agent.
func (a *authenticator) agentNames(token, agent string) ([]string, bool) {
	d := sha256.Sum256([]byte(token))
	var names []string
	ok := false
	for _, g := range a.agents {
		if subtle.ConstantTimeCompare(d[:], g.digest[:]) != 1 {
			continue
		}
		if g.prefix {
			names = append(names, g.name+"*")
			ok = ok || strings.HasPrefix(agent, g.name)
		} else {
			names = append(names, g.name)
			ok = ok || agent == g.name
		}
	}
	return names, ok
}

func newAuthenticator(ingestTokens, readTokens []string) *authenticator {
	a := &authenticator{tokens: map[string][][sha256.Size]byte{}}
	a.add(ScopeIngest, ingestTokens)
	a.add(ScopeRead, readTokens)
	return a
}

// add configures tokens of one scope.
func (a *authenticator) add(scope string, tokens []string) {
	for _, t := range tokens {
		a.tokens[scope] = append(a.tokens[scope], sha256.Sum256([]byte(t)))
	}
}

func (a *authenticator) open() bool {
	for _, ts := range a.tokens {
		if len(ts) > 0 {
			return false
		}
	}
	return true
}

// scopes returns every scope token holds.
func (a *authenticator) scopes(token string) []string {
	d := sha256.Sum256([]byte(token))
	var out []string
	// No early exit: every comparison runs whatever matches.
	for _, scope := range scopeOrder {
		match := 0
		for i := range a.tokens[scope] {
			match |= subtle.ConstantTimeCompare(d[:], a.tokens[scope][i][:])
		}
		if match == 1 {
			out = append(out, scope)
		}
	}
	return out
}

// scope returns the first scope of token, or "" when it matches none.
func (a *authenticator) scope(token string) string {
	if s := a.scopes(token); len(s) > 0 {
		return s[0]
	}
	return ""
}

// required returns the scope a request needs: "" (any token) to read,
// the jobs package's scope for its writing routes, ingest for the rest.
func required(c echo.Context) string {
	switch c.Request().Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return ""
	}
	if s, ok := jobs.Scopes[c.Request().Method+" "+c.Path()]; ok {
		return s
	}
	return ScopeIngest
}

// scopeRefusals say what a token of another scope lacks.
var scopeRefusals = map[string]string{
	ScopeIngest: "this token may not write runs: writing needs a token with ingest scope",
	ScopeSubmit: "this token may not submit or cancel jobs or set quotas: that needs a token with submit scope",
	ScopeAgent:  "only an agent's token may claim jobs and report on them: that needs a token with agent scope",
}

// middleware guards the /api/v1 group: reads (GET, HEAD) need a token of
// any scope, writes the scope required names. With no token configured
// the API is open, except the job routes that start processes on GPU
// nodes (submit and agent scopes): those always need their token. A
// request refused here never reaches a handler, so nothing of it is
// written.
func (a *authenticator) middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		need := required(c)
		if a.open() && need != ScopeSubmit && need != ScopeAgent {
			return next(c)
		}
		token, ok := bearerToken(c.Request().Header.Get(echo.HeaderAuthorization))
		var scopes []string
		if ok {
			scopes = a.scopes(token)
		}
		if len(scopes) == 0 {
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="deepseed"`)
			msg := "missing bearer token: send Authorization: Bearer <token>"
			switch {
			case ok:
				msg = "invalid bearer token"
			case len(a.tokens[need]) == 0 && (need == ScopeSubmit || need == ScopeAgent):
				msg = "missing bearer token: this route needs a token with " + need + " scope, and none is configured (set DEEPSEED_" + strings.ToUpper(need) + "_TOKENS on the server)"
			}
			return echo.NewHTTPError(http.StatusUnauthorized, api.Error{Error: msg})
		}
		if need == ScopeAgent && slices.Contains(scopes, need) {
			// An agent token acts as the agents it is bound to only: one
			// agent cannot claim or report in another's name.
			if names, ok := a.agentNames(token, c.Param("name")); !ok {
				msg := fmt.Sprintf("this token may not act as agent %q: DEEPSEED_AGENT_TOKENS binds it to %s", c.Param("name"), strings.Join(names, ", "))
				return echo.NewHTTPError(http.StatusForbidden, api.Error{Error: msg})
			}
		}
		if need != "" && !slices.Contains(scopes, need) {
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="deepseed", error="insufficient_scope", scope="`+need+`"`)
			msg := scopeRefusals[need]
			if need == ScopeIngest && slices.Equal(scopes, []string{ScopeRead}) {
				msg = "this token may only read: writing needs a token with ingest scope"
			}
			return echo.NewHTTPError(http.StatusForbidden, api.Error{Error: msg})
		}
		return next(c)
	}
}

// bearerToken extracts the token of an "Authorization: Bearer …" header.
func bearerToken(h string) (string, bool) {
	scheme, token, found := strings.Cut(strings.TrimSpace(h), " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}
