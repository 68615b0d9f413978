package query_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/query"
)

// handlerParams are the query parameters each read handler accepts, as
// the handlers read them. The API document must describe exactly these:
// a parameter it leaves out is one no client learns of, and one it
// invents is one clients send in vain.
var handlerParams = map[string][]string{
	"/runs":               {"project", "status", "tag", "sweep", "limit", "offset"},
	"/runs/:id":           {},
	"/runs/:id/series":    {"metric", "rank", "from_step", "to_step", "from", "to", "max_points"},
	"/runs/:id/heatmap":   {"pass", "max_steps", "rank", "from_step", "to_step"},
	"/runs/:id/evals":     {},
	"/runs/:id/breakdown": {"from_step", "rank"},
	"/runs/:id/memory":    {},
	"/runs/:id/ranks":     {"straggler_pct"},
	"/compare":            {"run", "sweep", "project", "baseline"},
	"/gpus":               {"host", "gpu", "run_id", "metric", "from", "to", "max_points"},
	"/annotations":        {"run_id", "type", "from", "to"},
}

func TestOpenAPIDescribesQueryParameters(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]struct {
			Parameters []struct {
				Name string `json:"name"`
				In   string `json:"in"`
			} `json:"parameters"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	for _, route := range query.Routes {
		want, ok := handlerParams[route]
		if !ok {
			t.Errorf("route %s: add its query parameters to handlerParams", route)
			continue
		}
		path := "/api/v1/" + strings.TrimPrefix(strings.ReplaceAll(route, ":id", "{id}"), "/")
		op, ok := doc.Paths[path]["get"]
		if !ok {
			t.Errorf("GET %s is not in api/openapi.json", path)
			continue
		}
		var got []string
		for _, p := range op.Parameters {
			if p.In == "query" {
				got = append(got, p.Name)
			}
		}
		slices.Sort(got)
		want = slices.Sorted(slices.Values(want))
		if !slices.Equal(got, want) {
			t.Errorf("GET %s: api/openapi.json describes query parameters %v, the handler reads %v", path, got, want)
		}
	}
}
