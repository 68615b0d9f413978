package api

import _ "embed"

// OpenAPI is the OpenAPI 3 document of the whole HTTP API, ingest and
// query, served at /api/v1/openapi.json. A test of the server fails when
// a route exists that it does not describe.
//
//go:embed openapi.json
var OpenAPI []byte
