package server

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
)

// serveOpenAPI answers GET /api/v1/openapi.json with the embedded API
// document.
func serveOpenAPI(c echo.Context) error {
	c.Response().Header().Set("Cache-Control", "no-cache")
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, api.OpenAPI)
}
