package server

import (
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
)

// observe logs each request and counts it in the request metrics, by
// route template (never the raw path, so label sets stay bounded). It
// never logs headers, so tokens stay out of the logs.
func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		if err := next(c); err != nil {
			// Write the error response now so its status is what we record.
			c.Error(err)
		}
		req, res := c.Request(), c.Response()
		route := c.Path()
		if route == "" || strings.HasSuffix(route, "*") || res.Status == http.StatusNotFound && route == APIPrefix {
			route = "unmatched"
		}
		method := methodLabel(req.Method)
		s.prom.requests.With(route, method, strconv.Itoa(res.Status)).Inc()
		s.prom.duration.With(route).Update(time.Since(start).Seconds())

		level := slog.LevelInfo
		switch {
		case route == "/healthz" || route == "/readyz" || route == "/metrics":
			// Probes and scrapes arrive every few seconds; keep them out of
			// the default log. A 503 from /readyz is an answer, not a
			// failure (the database is starting or away): readyz logs
			// each change of readiness once.
			level = slog.LevelDebug
		case res.Status == http.StatusServiceUnavailable:
			// The database is away and the sender is asked to retry;
			// the handler has said why.
			level = slog.LevelWarn
		case res.Status >= 500:
			level = slog.LevelError
		}
		s.log.LogAttrs(req.Context(), level, "http request",
			slog.String("method", req.Method),
			slog.String("path", req.URL.Path),
			slog.String("route", route),
			slog.Int("status", res.Status),
			slog.Int64("bytes_in", req.ContentLength),
			slog.Int64("bytes_out", res.Size),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
			slog.String("remote", c.RealIP()),
		)
		return nil
	}
}

// methodLabel bounds the method label to the standard methods.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	}
	return "other"
}

// recover turns a panic in a handler into a 500 answer and a logged stack,
// so no input can take the process down.
func (s *Server) recover(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			r := recover()
			if r == nil {
				return
			}
			if r == http.ErrAbortHandler {
				panic(r)
			}
			s.log.Error("panic serving request", "method", c.Request().Method, "path", c.Request().URL.Path,
				"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = echo.NewHTTPError(http.StatusInternalServerError, "internal server error")
		}()
		return next(c)
	}
}
