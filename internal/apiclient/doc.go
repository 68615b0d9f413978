// Package apiclient is a Go client of DeepSeed's HTTP API, generated from
// api/openapi.json by oapi-codegen (a tool dependency in go.mod). It
// exists to prove the document: its tests regenerate it, fail when the
// committed client is stale, and call every GET operation of a real
// server through it.
package apiclient

//go:generate go tool oapi-codegen -config oapi-codegen.yaml -o client.gen.go ../../api/openapi.json
