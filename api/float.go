package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// Float is a float64 that survives JSON with its non-finite values.
//
// It decodes from a JSON number or from the strings "NaN", "Infinity" and
// "-Infinity" (also "inf"/"-inf", any case). Bare NaN/Infinity tokens, as
// Python's json module writes them, are turned into those strings by
// [NormalizeJSON] before decoding. It encodes finite values as numbers and
// non-finite ones as the strings "NaN", "Infinity" and "-Infinity", so every
// response stays valid JSON.
type Float float64

// MarshalJSON implements json.Marshaler.
func (f Float) MarshalJSON() ([]byte, error) {
	v := float64(f)
	switch {
	case math.IsNaN(v):
		return []byte(`"NaN"`), nil
	case math.IsInf(v, 1):
		return []byte(`"Infinity"`), nil
	case math.IsInf(v, -1):
		return []byte(`"-Infinity"`), nil
	}
	if v == math.Trunc(v) && math.Abs(v) < 1e21 {
		// Whole numbers (byte counts, steps) as integers: 4022000000,
		// not 4.022e+09.
		return strconv.AppendFloat(nil, v, 'f', -1, 64), nil
	}
	return strconv.AppendFloat(nil, v, 'g', -1, 64), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (f *Float) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return fmt.Errorf("empty number")
	}
	if b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, ok := ParseNonFinite(s)
		if !ok {
			return fmt.Errorf("want a number, got string %q", s)
		}
		*f = Float(v)
		return nil
	}
	if b[0] != '-' && (b[0] < '0' || b[0] > '9') {
		return fmt.Errorf("want a number, got %s", truncate(string(b), 32))
	}
	v, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		// Overflowing literals such as 1e999 become ±Inf, as Python reads them.
		if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
			*f = Float(v)
			return nil
		}
		return fmt.Errorf("want a number: %w", err)
	}
	*f = Float(v)
	return nil
}

// ParseNonFinite recognises the spellings of NaN and the infinities.
func ParseNonFinite(s string) (float64, bool) {
	switch s {
	case "NaN", "nan", "NAN":
		return math.NaN(), true
	case "Infinity", "infinity", "inf", "Inf", "+Infinity", "+inf":
		return math.Inf(1), true
	case "-Infinity", "-infinity", "-inf", "-Inf":
		return math.Inf(-1), true
	}
	return 0, false
}

// F returns a pointer to a Float, for building records in code.
func F(v float64) *Float { f := Float(v); return &f }

// Ptr returns a pointer to v.
func Ptr[T any](v T) *T { return &v }

// NormalizeJSON rewrites the bare tokens NaN, Infinity and -Infinity that
// appear outside strings into the strings "NaN", "Infinity" and "-Infinity",
// so that encoding/json accepts what Python's json module writes. Everything
// else is copied unchanged. It returns b itself when there is nothing to do.
func NormalizeJSON(b []byte) []byte {
	if !bytes.Contains(b, []byte("NaN")) && !bytes.Contains(b, []byte("Infinity")) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	inStr := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inStr {
			out = append(out, c)
			if c == '\\' && i+1 < len(b) {
				i++
				out = append(out, b[i])
			} else if c == '"' {
				inStr = false
			}
			continue
		}
		switch {
		case c == '"':
			inStr = true
			out = append(out, c)
		case bytes.HasPrefix(b[i:], []byte("NaN")):
			out = append(out, `"NaN"`...)
			i += 2
		case bytes.HasPrefix(b[i:], []byte("-Infinity")):
			out = append(out, `"-Infinity"`...)
			i += 8
		case bytes.HasPrefix(b[i:], []byte("Infinity")):
			out = append(out, `"Infinity"`...)
			i += 7
		default:
			out = append(out, c)
		}
	}
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
