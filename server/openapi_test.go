package server

import (
	"encoding/json"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store/storetest"
)

type openAPIDoc struct {
	OpenAPI    string                                `json:"openapi"`
	Paths      map[string]map[string]json.RawMessage `json:"paths"`
	Components struct {
		Schemas map[string]struct {
			Properties map[string]json.RawMessage `json:"properties"`
		} `json:"schemas"`
	} `json:"components"`
}

func loadOpenAPI(t *testing.T) openAPIDoc {
	t.Helper()
	var doc openAPIDoc
	if err := json.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatalf("api/openapi.json is not valid JSON: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi = %q, want 3.x", doc.OpenAPI)
	}
	return doc
}

var echoParam = regexp.MustCompile(`:([A-Za-z_]+)`)

// Every route the server registers, whatever its role, is described by
// the API document.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	doc := loadOpenAPI(t)
	srv := New(testConfig(), storetest.NewStore(t), nil)
	seen := 0
	for _, r := range srv.Routes() {
		if r.Method == echo.RouteNotFound {
			continue // echo's catch-all for 404s, not an API route
		}
		path := echoParam.ReplaceAllString(r.Path, "{$1}")
		ops, ok := doc.Paths[path]
		if !ok {
			t.Errorf("route %s %s is not in api/openapi.json", r.Method, path)
			continue
		}
		if _, ok := ops[strings.ToLower(r.Method)]; !ok {
			t.Errorf("route %s %s: api/openapi.json describes the path but not the method", r.Method, path)
		}
		seen++
	}
	if seen < 4 {
		t.Fatalf("only %d routes registered; the server lost its probes", seen)
	}
}

// The document is served without a token.
func TestOpenAPIServed(t *testing.T) {
	cfg := testConfig()
	cfg.ReadTokens = []string{readToken}
	r := start(t, New(cfg, storetest.NewStore(t), nil))
	code, body, hdr := do(t, http.MethodGet, r.url+"/api/v1/openapi.json", "", "")
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") || string(body) != string(api.OpenAPI) {
		t.Fatalf("GET /api/v1/openapi.json: %d %q", code, hdr.Get("Content-Type"))
	}
}

// The document's schemas name exactly the JSON fields of the wire types,
// and every reference resolves.
func TestOpenAPISchemasMatchWireTypes(t *testing.T) {
	doc := loadOpenAPI(t)
	types := map[string]any{
		"Run": api.Run{}, "RunMeta": api.RunMeta{}, "Step": api.Step{}, "Layers": api.Layers{}, "Eval": api.Eval{},
		"GPU": api.GPU{}, "GPUProcess": api.GPUProcess{}, "Host": api.Host{}, "HostProcess": api.HostProcess{},
		"Memory": api.Memory{}, "Event": api.Event{}, "End": api.End{}, "Process": api.Process{},
		"Error": api.Error{}, "RecordError": api.RecordError{}, "IngestResult": api.IngestResult{},
		"RunList": api.RunList{}, "RunSummary": api.RunSummary{}, "RunDetail": api.RunDetail{}, "RollupLag": api.RollupLag{},
		"SeriesResponse": api.SeriesResponse{}, "Series": api.Series{}, "Point": api.Point{},
		"Heatmap": api.Heatmap{}, "EvalsResponse": api.EvalsResponse{}, "EvalPoint": api.EvalPoint{},
		"Breakdown": api.Breakdown{}, "BreakdownPart": api.BreakdownPart{},
		"MemoryResponse": api.MemoryResponse{}, "MemoryPart": api.MemoryPart{},
		"RanksResponse": api.RanksResponse{}, "RankStat": api.RankStat{},
		"CompareResponse": api.CompareResponse{}, "CompareRow": api.CompareRow{},
		"GPUResponse": api.GPUResponse{}, "GPUSeries": api.GPUSeries{}, "TimePoint": api.TimePoint{},
		"AnnotationsResponse": api.AnnotationsResponse{}, "Annotation": api.Annotation{},
		"AlertList": api.AlertList{}, "Alert": api.Alert{}, "WastedGPUHours": api.WastedGPUHours{},
		"Regression": api.Regression{}, "Fingerprint": api.Fingerprint{}, "Figure": api.Figure{}, "PlaceDelta": api.PlaceDelta{},
		"Difference": api.Difference{}, "Ledger": api.Ledger{}, "LedgerItem": api.LedgerItem{}, "ProjectLedger": api.ProjectLedger{},
		"LedgerDay": api.LedgerDay{},
		"Sweep":     api.Sweep{}, "SweepSummary": api.SweepSummary{}, "SweepList": api.SweepList{}, "Quota": api.Quota{},
		"Readiness": Readiness{}, "ReadDatabase": ReadDatabase{}, "RollupState": RollupState{},
	}
	for name, v := range types {
		s, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("schema %s missing", name)
			continue
		}
		var got []string
		for p := range s.Properties {
			got = append(got, p)
		}
		sort.Strings(got)
		want := jsonFields(reflect.TypeOf(v))
		if !slices.Equal(got, want) {
			t.Errorf("schema %s has properties %v, the Go type has %v", name, got, want)
		}
	}
	for _, m := range regexp.MustCompile(`"#/components/schemas/([A-Za-z]+)"`).FindAllSubmatch(api.OpenAPI, -1) {
		if _, ok := doc.Components.Schemas[string(m[1])]; !ok {
			t.Errorf("reference to missing schema %s", m[1])
		}
	}
}

// jsonFields lists the JSON names of t's fields, embedded structs flattened.
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if f.Anonymous && tag == "" {
			out = append(out, jsonFields(f.Type)...)
			continue
		}
		if !f.IsExported() || tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// Every operation has an operationId of its own, so that clients
// generated from the document get usable names.
func TestOpenAPIOperationIDs(t *testing.T) {
	doc := loadOpenAPI(t)
	seen := map[string]string{}
	for path, ops := range doc.Paths {
		for method, raw := range ops {
			if !slices.Contains([]string{"get", "put", "post", "delete", "patch", "head", "options"}, method) {
				continue
			}
			var op struct {
				OperationID string `json:"operationId"`
			}
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			where := strings.ToUpper(method) + " " + path
			switch other, dup := seen[op.OperationID]; {
			case op.OperationID == "":
				t.Errorf("%s has no operationId", where)
			case dup:
				t.Errorf("%s and %s share operationId %s", where, other, op.OperationID)
			}
			seen[op.OperationID] = where
		}
	}
	if len(seen) < 20 {
		t.Fatalf("only %d operations in api/openapi.json", len(seen))
	}
}
