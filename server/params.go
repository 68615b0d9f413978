package server

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
)

// maxParamBytes bounds a query parameter's value; no id, name or list the
// API takes comes near it.
const maxParamBytes = 8192

// checkText refuses, before any handler sees them, a path or query
// parameter that no column could hold: NUL bytes, invalid UTF-8, or an
// absurd length. PostgreSQL refuses such text in a query, which used to
// surface as a 500.
func checkText(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		if msg := textProblem(req.URL.Path, 1<<16); msg != "" {
			return c.JSON(http.StatusBadRequest, api.Error{Error: "the path " + msg})
		}
		q, err := url.ParseQuery(req.URL.RawQuery)
		if err != nil {
			return c.JSON(http.StatusBadRequest, api.Error{Error: "malformed query string: " + err.Error()})
		}
		for name, values := range q {
			if msg := textProblem(name, 256); msg != "" {
				return c.JSON(http.StatusBadRequest, api.Error{Error: fmt.Sprintf("query parameter name %q %s", name, msg)})
			}
			for _, v := range values {
				if msg := textProblem(v, maxParamBytes); msg != "" {
					return c.JSON(http.StatusBadRequest, api.Error{Error: fmt.Sprintf("query parameter %s %s", name, msg)})
				}
			}
		}
		return next(c)
	}
}

func textProblem(s string, max int) string {
	switch {
	case len(s) > max:
		return fmt.Sprintf("is longer than %d bytes", max)
	case strings.IndexByte(s, 0) >= 0:
		return "holds a NUL character"
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	}
	return ""
}

// unescapeParams gives handlers path parameters as they were written. A
// run id may hold any text, "/" included; a client sends it
// percent-encoded (GET /runs/team%2Fexp-1), the router then matches on
// the escaped path and hands over the escaped value, which this decodes.
// A path with nothing escaped that way was matched decoded already.
func unescapeParams(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if c.Request().URL.RawPath != "" {
			vals := c.ParamValues()
			for i, v := range vals {
				if u, err := url.PathUnescape(v); err == nil {
					vals[i] = u
				}
			}
			c.SetParamValues(vals...)
		}
		return next(c)
	}
}
