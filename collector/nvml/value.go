package nvml

import (
	"reflect"
	"strings"
	"unsafe"
)

// Getter returns the reader of the value named by its JSON name, of the
// reading or else of the device's facts: it gives the value as a float64
// in NVML's unit (a flag is 0 or 1), ok false when the device gave none.
// Getter returns nil for a name no field has. It is how the collector
// reads the values its metric table (api.GPUMetrics) names; the field is
// looked up once, so a read costs what a hand-written one does.
func Getter(name string) func(info *DeviceInfo, r *Reading) (v float64, ok bool) {
	if f, found := readingFields[name]; found {
		return func(_ *DeviceInfo, r *Reading) (float64, bool) { return f.read(unsafe.Pointer(r)) }
	}
	if f, found := infoFields[name]; found {
		return func(info *DeviceInfo, _ *Reading) (float64, bool) { return f.read(unsafe.Pointer(info)) }
	}
	return nil
}

// field is where a number or flag sits in a struct, and its type.
type field struct {
	offset uintptr
	kind   reflect.Kind
	ptr    bool
}

var (
	readingFields = numericFields(reflect.TypeOf(Reading{}))
	infoFields    = numericFields(reflect.TypeOf(DeviceInfo{}))
)

// numericFields maps the JSON names of t's numbers and flags, bare or
// behind a pointer, to where they sit.
func numericFields(t reflect.Type) map[string]field {
	out := map[string]field{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		ft, ptr := f.Type, false
		if ft.Kind() == reflect.Pointer {
			ft, ptr = ft.Elem(), true
		}
		switch ft.Kind() {
		case reflect.Bool, reflect.Int, reflect.Uint32, reflect.Uint64, reflect.Float64:
			name := strings.Split(f.Tag.Get("json"), ",")[0]
			if name != "" && name != "-" {
				out[name] = field{offset: f.Offset, kind: ft.Kind(), ptr: ptr}
			}
		}
	}
	return out
}

// read reads the field of the struct at base; numericFields vouches for
// its offset and type.
func (f field) read(base unsafe.Pointer) (float64, bool) {
	p := unsafe.Add(base, f.offset)
	if f.ptr {
		p = *(*unsafe.Pointer)(p)
		if p == nil {
			return 0, false
		}
	}
	switch f.kind {
	case reflect.Bool:
		if *(*bool)(p) {
			return 1, true
		}
		return 0, true
	case reflect.Int:
		return float64(*(*int)(p)), true
	case reflect.Uint32:
		return float64(*(*uint32)(p)), true
	case reflect.Uint64:
		return float64(*(*uint64)(p)), true
	case reflect.Float64:
		return *(*float64)(p), true
	}
	return 0, false
}
