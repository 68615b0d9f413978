package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
)

// Token scopes. An ingest token may also read.
const (
	ScopeRead   = "read"
	ScopeIngest = "ingest"
)

// authenticator checks bearer tokens. Tokens are kept as SHA-256 digests
// and compared in constant time against every configured token, so
// neither a token's content nor its length leaks through timing.
type authenticator struct {
	ingest [][sha256.Size]byte
	read   [][sha256.Size]byte
}

func newAuthenticator(ingestTokens, readTokens []string) *authenticator {
	a := &authenticator{}
	for _, t := range ingestTokens {
		a.ingest = append(a.ingest, sha256.Sum256([]byte(t)))
	}
	for _, t := range readTokens {
		a.read = append(a.read, sha256.Sum256([]byte(t)))
	}
	return a
}

func (a *authenticator) open() bool { return len(a.ingest) == 0 && len(a.read) == 0 }

// scope returns the scope of token, or "" when it matches none.
func (a *authenticator) scope(token string) string {
	d := sha256.Sum256([]byte(token))
	var isIngest, isRead int
	// No early exit: every comparison runs whatever matches.
	for i := range a.ingest {
		isIngest |= subtle.ConstantTimeCompare(d[:], a.ingest[i][:])
	}
	for i := range a.read {
		isRead |= subtle.ConstantTimeCompare(d[:], a.read[i][:])
	}
	switch {
	case isIngest == 1:
		return ScopeIngest
	case isRead == 1:
		return ScopeRead
	}
	return ""
}

// middleware guards the /api/v1 group: reads (GET, HEAD) need a read or
// ingest token, everything else an ingest token. A request refused here
// never reaches a handler, so nothing of it is written.
func (a *authenticator) middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if a.open() {
			return next(c)
		}
		token, ok := bearerToken(c.Request().Header.Get(echo.HeaderAuthorization))
		scope := ""
		if ok {
			scope = a.scope(token)
		}
		if scope == "" {
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="deepseed"`)
			msg := "missing bearer token: send Authorization: Bearer <token>"
			if ok {
				msg = "invalid bearer token"
			}
			return echo.NewHTTPError(http.StatusUnauthorized, api.Error{Error: msg})
		}
		switch c.Request().Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
		default:
			if scope != ScopeIngest {
				c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="deepseed", error="insufficient_scope", scope="ingest"`)
				return echo.NewHTTPError(http.StatusForbidden, api.Error{Error: "this token may only read: writing needs a token with ingest scope"})
			}
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
