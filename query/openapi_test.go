package query_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/query"
)

// handlerParams are the query parameters each read handler accepts, as
// the handlers read them. The API document must describe exactly these:
// a parameter it leaves out is one no client learns of, and one it
// invents is one clients send in vain.
var handlerParams = map[string][]string{
	"/runs":                {"project", "status", "tag", "sweep", "limit", "offset"},
	"/runs/:id":            {},
	"/runs/:id/series":     {"metric", "rank", "from_step", "to_step", "from", "to", "max_points", "top"},
	"/runs/:id/heatmap":    {"pass", "max_steps", "rank", "from_step", "to_step"},
	"/runs/:id/evals":      {},
	"/runs/:id/breakdown":  {"from_step", "rank"},
	"/runs/:id/memory":     {},
	"/runs/:id/ranks":      {"straggler_pct", "from_step"},
	"/compare":             {"run", "sweep", "project", "baseline"},
	"/gpus":                {"host", "gpu", "run_id", "rank", "metric", "from", "to", "max_points", "per_gpu"},
	"/annotations":         {"run_id", "type", "from", "to"},
	"/alerts":              {"project", "run_id", "state", "kind", "limit"},
	"/runs/:id/regression": {"baseline", "baseline_tag"},
	"/runs/:id/ledger":     {},
	"/ledger":              {"project", "limit"},
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

// docParam is a query parameter as api/openapi.json describes it.
type docParam struct {
	Name        string `json:"name"`
	In          string `json:"in"`
	Description string `json:"description"`
	Schema      struct {
		Type     string   `json:"type"`
		Minimum  *float64 `json:"minimum"`
		Maximum  *float64 `json:"maximum"`
		Enum     []string `json:"enum"`
		Pattern  string   `json:"pattern"`
		MaxItems *int     `json:"maxItems"`
		Items    struct {
			Enum []string `json:"enum"`
		} `json:"items"`
	} `json:"schema"`
}

// TestOpenAPIParameterLimitsAreTheHandlers holds every documented limit of
// a query parameter to what its handler does: a value just past a
// documented minimum or maximum, outside an enum or pattern, an array one
// item too long, or a time that is no time is a 400 naming that parameter,
// and the documented bounds themselves are accepted.
func TestOpenAPIParameterLimitsAreTheHandlers(t *testing.T) {
	e := newEnv(t)
	e.write(runRec("r", nil), stepRec("r", 0, 1, nil))
	var doc struct {
		Paths map[string]map[string]struct {
			Parameters []docParam `json:"parameters"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	// answer sends one parameter and returns the status and the
	// parameter a 400 names.
	answer := func(path, name string, values ...string) (int, string) {
		t.Helper()
		q := url.Values{name: values}
		// /compare needs something to compare.
		if strings.HasSuffix(path, "/compare") && name != "run" {
			q.Set("run", "r")
		}
		res, err := http.Get(e.srv.URL + strings.ReplaceAll(path, "{id}", "r") + "?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		var ae api.Error
		if res.StatusCode == http.StatusBadRequest {
			if err := json.Unmarshal(body, &ae); err != nil {
				t.Fatalf("%s %s=%v: 400 is not an api.Error: %s", path, name, values, body)
			}
		}
		return res.StatusCode, ae.Param
	}
	refused := func(path string, p docParam, why string, values ...string) {
		t.Helper()
		if code, param := answer(path, p.Name, values...); code != http.StatusBadRequest || param != p.Name {
			t.Errorf("GET %s %s=%v (%s): status %d naming %q, want 400 naming %s", path, p.Name, values, why, code, param, p.Name)
		}
	}
	taken := func(path string, p docParam, why string, values ...string) {
		t.Helper()
		if code, param := answer(path, p.Name, values...); code != http.StatusOK {
			t.Errorf("GET %s %s=%v (%s): status %d naming %q, want 200", path, p.Name, values, why, code, param)
		}
	}
	num := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	checked := 0
	for _, route := range query.Routes {
		path := "/api/v1/" + strings.TrimPrefix(strings.ReplaceAll(route, ":id", "{id}"), "/")
		for _, p := range doc.Paths[path]["get"].Parameters {
			if p.In != "query" {
				continue
			}
			sc := p.Schema
			switch sc.Type {
			case "integer", "number":
				refused(path, p, "not a number", "x")
				// Integers past 2^53 do not survive float64: step them as
				// integers.
				next := func(v float64, d int64) string {
					if sc.Type == "integer" {
						return strconv.FormatInt(int64(v)+d, 10)
					}
					return num(v + float64(d))
				}
				if sc.Minimum != nil {
					taken(path, p, "the documented minimum", next(*sc.Minimum, 0))
					refused(path, p, "below the documented minimum", next(*sc.Minimum, -1))
				}
				if sc.Maximum != nil {
					taken(path, p, "the documented maximum", next(*sc.Maximum, 0))
					refused(path, p, "above the documented maximum", next(*sc.Maximum, 1))
				}
				checked++
			case "string":
				switch {
				case len(sc.Enum) > 0:
					for _, v := range sc.Enum {
						taken(path, p, "in the enum", v)
					}
					refused(path, p, "not in the enum", "bogus")
					checked++
				case sc.Pattern != "":
					refused(path, p, "not matching "+sc.Pattern, "bogus")
					checked++
				case strings.Contains(p.Description, "RFC 3339"):
					refused(path, p, "not a time", "yesterday")
					// Within half an hour of now, on the side of its
					// default partner.
					at := time.Now().Add(-30 * time.Minute)
					if p.Name == "to" {
						at = at.Add(time.Hour)
					}
					taken(path, p, "Unix milliseconds", strconv.FormatInt(at.UnixMilli(), 10))
					checked++
				}
			case "array":
				if len(sc.Items.Enum) > 0 {
					taken(path, p, "in the enum", sc.Items.Enum...)
					refused(path, p, "not in the enum", "bogus")
					checked++
				}
				if sc.MaxItems != nil {
					var vs []string
					for i := 0; i <= *sc.MaxItems; i++ {
						vs = append(vs, fmt.Sprintf("metrics.m%d", i))
					}
					refused(path, p, "one item too many", vs...)
					checked++
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d parameters had a documented limit to check", checked)
	}
}
