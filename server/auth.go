package server

import (
	"crypto/sha256"
	"crypto/subtle"
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
