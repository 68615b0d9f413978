package api_test

import (
	"strings"
	"testing"

	"github.com/deepseed/deepseed/api"
)

// poisonObjects are JSON texts PostgreSQL refuses as jsonb; each once made
// the server answer 500.
var poisonObjects = []string{
	`{"n":1e1000000}`, `{"n":-1e131072}`, `{"n":1e-16384}`, `{"n":0.5e-16384}`, `{"a":"\u0000"}`, `{"a\u0000":1}`,
	`{"a":"\ud800"}`, `{"a":"x\udc00"}`, `{"a":"\ud800\ud800"}`, `{"a":"\ud800x"}`, `{"a":"\ud800\n"}`, "{\"a\":\"\xff\"}",
}

func TestJSONProblem(t *testing.T) {
	for _, p := range poisonObjects {
		if api.JSONProblem([]byte(p)) == "" {
			t.Errorf("%q: no problem found; PostgreSQL refuses it", p)
		}
	}
	for _, ok := range []string{
		`{"n":1e131071}`, `{"n":1e-16383}`, `{"n":-123.456e10}`, `{"a":"\ud83d\ude00"}`, `{"a":"\u00e9\n\t\"\\"}`,
		`{"a":[1,2,{"b":null,"c":true}]}`, `{"n":0}`, `{"big":` + strings.Repeat("9", 5000) + `}`, `{"é":"ü"}`,
	} {
		if msg := api.JSONProblem([]byte(ok)); msg != "" {
			t.Errorf("%q: %s; PostgreSQL takes it", ok, msg)
		}
	}
}
