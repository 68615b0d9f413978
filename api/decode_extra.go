package api

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
)

// locateField finds the JSON key of raw whose value does not decode into
// the matching field of target (a pointer to a record struct). encoding/json
// reports errors from custom unmarshalers such as [Float] and [Time]
// without the field, and a sender needs to know which one is wrong.
// Nested objects are searched too ("meta.zero_stage"). It returns "" when
// no single key is at fault.
func locateField(raw []byte, target any) string {
	t := reflect.TypeOf(target)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return locateIn(raw, t, "")
}

func locateIn(raw []byte, t reflect.Type, prefix string) string {
	if t.Kind() != reflect.Struct {
		return ""
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		key, _ := tok.(string)
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return prefix + key
		}
		f, ok := fieldByJSONName(t, key)
		if !ok {
			continue
		}
		v := reflect.New(f.Type)
		if err := json.Unmarshal(val, v.Interface()); err != nil {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if inner := locateIn(val, ft, prefix+key+"."); inner != "" {
				return inner
			}
			return prefix + key
		}
	}
	return ""
}

func fieldByJSONName(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}
