package nvml

import (
	"reflect"
	"strings"
)

// Value returns the value named by its JSON name, of the reading or else
// of the device's facts, as a float64 in NVML's unit (a flag is 0 or 1);
// ok is false when the device gave none or no field has that name. It is
// how the collector reads the values its metric table (api.GPUMetrics)
// names.
func Value(info *DeviceInfo, r *Reading, name string) (v float64, ok bool) {
	if i, found := readingFields[name]; found {
		return number(reflect.ValueOf(r).Elem().Field(i))
	}
	if i, found := infoFields[name]; found {
		return number(reflect.ValueOf(info).Elem().Field(i))
	}
	return 0, false
}

// HasValue reports whether Value knows the name.
func HasValue(name string) bool {
	_, r := readingFields[name]
	_, d := infoFields[name]
	return r || d
}

var (
	readingFields = numericFields(reflect.TypeOf(Reading{}))
	infoFields    = numericFields(reflect.TypeOf(DeviceInfo{}))
)

// numericFields maps the JSON names of t's numbers and flags, bare or
// behind a pointer, to their field indexes.
func numericFields(t reflect.Type) map[string]int {
	out := map[string]int{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch ft.Kind() {
		case reflect.Bool, reflect.Int, reflect.Uint32, reflect.Uint64, reflect.Float64:
			name := strings.Split(f.Tag.Get("json"), ",")[0]
			if name != "" && name != "-" {
				out[name] = i
			}
		}
	}
	return out
}

func number(v reflect.Value) (float64, bool) {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return 0, false
		}
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.Bool:
		if v.Bool() {
			return 1, true
		}
		return 0, true
	case reflect.Int:
		return float64(v.Int()), true
	case reflect.Uint32, reflect.Uint64:
		return float64(v.Uint()), true
	case reflect.Float64:
		return v.Float(), true
	}
	return 0, false
}
