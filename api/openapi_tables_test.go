package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/api"
)

// The API document describes every value of the metric table that a gpu
// record carries (a property of the GPU schema) and every stored one as a
// metric /gpus accepts, and names every alert kind of api.AlertKinds (the
// /alerts kind parameter, an alert's kind): `go test ./api -run
// TestOpenAPIDescribesTheTables -update` writes these parts from the
// tables, and this test fails until the committed document is what that
// writes.
func TestOpenAPIDescribesTheTables(t *testing.T) {
	const path = "openapi.json"
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := gpuMetricsInOpenAPI(doc)
	if err != nil {
		t.Fatal(err)
	}
	if want, err = alertKindsInOpenAPI(want); err != nil {
		t.Fatal(err)
	}
	if want, err = stepFieldsInOpenAPI(want); err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if !bytes.Equal(doc, want) {
		t.Errorf("api/openapi.json does not describe the metric table's GPU values, the step table or the alert kinds: run go test ./api -run TestOpenAPIDescribesTheTables -update")
	}
}

// gpuMetricsInOpenAPI returns doc with the GPU schema's properties holding
// every record value of the table (those already there kept as they are)
// and the enum of /gpus' metric parameter being the stored values, both
// sorted by name and laid out as the rest of the document (two spaces an
// indent).
func gpuMetricsInOpenAPI(doc []byte) ([]byte, error) {
	// The GPU record's properties.
	schema := bytes.Index(doc, []byte("\n      \"GPU\": {"))
	if schema < 0 {
		return nil, fmt.Errorf("no GPU schema")
	}
	props, err := objectAfter(doc, schema, `"properties": `)
	if err != nil {
		return nil, fmt.Errorf("GPU schema: %w", err)
	}
	var have map[string]json.RawMessage
	if err := json.Unmarshal(doc[props[0]:props[1]], &have); err != nil {
		return nil, fmt.Errorf("GPU schema: %w", err)
	}
	for _, m := range api.GPUMetrics {
		if m.Field == nil || have[m.Name] != nil {
			continue
		}
		switch m.Field(&api.GPU{}).(type) {
		case **api.Float:
			have[m.Name] = json.RawMessage(`{"anyOf": [{"$ref": "#/components/schemas/Float"}, {"type": "null"}]}`)
		case **int64:
			have[m.Name] = json.RawMessage(`{"type": ["integer", "null"], "format": "int64"}`)
		default:
			return nil, fmt.Errorf("metric %s: a record field of type %T", m.Name, m.Field(&api.GPU{}))
		}
	}
	doc, err = replaceJSON(doc, props, have)
	if err != nil {
		return nil, err
	}

	// The metrics /gpus accepts.
	gpus := bytes.Index(doc, []byte(`"/api/v1/gpus": {`))
	if gpus < 0 {
		return nil, fmt.Errorf("no /api/v1/gpus path")
	}
	param := bytes.Index(doc[gpus:], []byte(`"name": "metric",`))
	if param < 0 {
		return nil, fmt.Errorf("/api/v1/gpus: no metric parameter")
	}
	enum, err := objectAfter(doc, gpus+param, `"enum": `)
	if err != nil {
		return nil, fmt.Errorf("/api/v1/gpus metric: %w", err)
	}
	var names []string
	for _, m := range api.GPUColumns() {
		names = append(names, m.Name)
	}
	slices.Sort(names)
	return replaceJSON(doc, enum, names)
}

// stepFieldsInOpenAPI returns doc with the Step schema's properties
// holding every value of the step table: a document that has them all is
// left as it is, one that misses some gets them, the properties then
// sorted by name (those already there kept as they are, with their
// descriptions).
func stepFieldsInOpenAPI(doc []byte) ([]byte, error) {
	schema := bytes.Index(doc, []byte("\n      \"Step\": {"))
	if schema < 0 {
		return nil, fmt.Errorf("no Step schema")
	}
	props, err := objectAfter(doc, schema, `"properties": `)
	if err != nil {
		return nil, fmt.Errorf("Step schema: %w", err)
	}
	var have map[string]json.RawMessage
	if err := json.Unmarshal(doc[props[0]:props[1]], &have); err != nil {
		return nil, fmt.Errorf("Step schema: %w", err)
	}
	missing := false
	for _, f := range api.StepFields {
		if have[f.Name] != nil {
			continue
		}
		missing = true
		switch f.Field(&api.Step{}).(type) {
		case **api.Float:
			have[f.Name] = json.RawMessage(`{"anyOf": [{"$ref": "#/components/schemas/Float"}, {"type": "null"}]}`)
		case **int64:
			have[f.Name] = json.RawMessage(`{"type": ["integer", "null"], "format": "int64", "minimum": 0}`)
		case **bool:
			have[f.Name] = json.RawMessage(`{"type": ["boolean", "null"]}`)
		default:
			return nil, fmt.Errorf("step field %s: a record field of type %T", f.Name, f.Field(&api.Step{}))
		}
	}
	if !missing {
		return doc, nil
	}
	return replaceJSON(doc, props, have)
}

// alertKindsInOpenAPI returns doc with the enums of the /alerts kind
// parameter and of an alert's kind being api.AlertKinds, in its order.
func alertKindsInOpenAPI(doc []byte) ([]byte, error) {
	for _, at := range []struct{ what, from, key string }{
		{"/alerts kind parameter", `"/api/v1/alerts": {`, `"name": "kind",`},
		{"Alert schema's kind", "\n      \"Alert\": {", `"kind": {`},
	} {
		from := bytes.Index(doc, []byte(at.from))
		if from < 0 {
			return nil, fmt.Errorf("%s: no %s", at.what, at.from)
		}
		key := bytes.Index(doc[from:], []byte(at.key))
		if key < 0 {
			return nil, fmt.Errorf("%s: no %s", at.what, at.key)
		}
		enum, err := objectAfter(doc, from+key, `"enum": `)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", at.what, err)
		}
		if doc, err = replaceJSON(doc, enum, api.AlertKinds); err != nil {
			return nil, err
		}
	}
	return doc, nil
}

// objectAfter returns where the JSON value after the first key (as
// `"key": `) at or past from begins and ends in doc.
func objectAfter(doc []byte, from int, key string) ([2]int, error) {
	i := bytes.Index(doc[from:], []byte(key))
	if i < 0 {
		return [2]int{}, fmt.Errorf("no %s", strings.TrimSuffix(key, ": "))
	}
	start := from + i + len(key)
	dec := json.NewDecoder(bytes.NewReader(doc[start:]))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return [2]int{}, err
	}
	return [2]int{start, start + int(dec.InputOffset())}, nil
}

// replaceJSON puts v, indented as the line it starts on, in place of
// doc[at[0]:at[1]]. Objects come out with their keys sorted.
func replaceJSON(doc []byte, at [2]int, v any) ([]byte, error) {
	line := bytes.LastIndexByte(doc[:at[0]], '\n') + 1
	indent := doc[line : line+len(doc[line:at[0]])-len(bytes.TrimLeft(doc[line:at[0]], " "))]
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent(string(indent), "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	out := slices.Concat(doc[:at[0]], bytes.TrimSuffix(b.Bytes(), []byte("\n")), doc[at[1]:])
	return out, nil
}
