package api

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// PostgreSQL's numeric, which jsonb stores numbers as, holds at most
// 131,072 digits before the decimal point and 16,383 after it; a number in
// a JSON object past either is refused by the database ("value overflows
// numeric format").
const (
	maxNumericIntDigits  = 131072
	maxNumericFracDigits = 16383
)

// JSONProblem says why PostgreSQL would refuse the JSON text raw as jsonb,
// or "" when it would take it: invalid UTF-8, a \u0000 escape (jsonb
// cannot hold NUL), a lone UTF-16 surrogate escape, or a number outside
// numeric's range. raw must already be syntactically valid JSON.
func JSONProblem(raw []byte) string {
	if !utf8.Valid(raw) {
		return "not valid UTF-8"
	}
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case c == '"':
			end, msg := stringProblem(raw, i+1)
			if msg != "" {
				return msg
			}
			i = end
		case c == '-' || (c >= '0' && c <= '9'):
			end, msg := numberProblem(raw, i)
			if msg != "" {
				return msg
			}
			i = end - 1
		}
	}
	return ""
}

// stringProblem scans the string whose body starts at i and returns the
// index of its closing quote.
func stringProblem(b []byte, i int) (int, string) {
	pendingHigh := false
	for ; i < len(b); i++ {
		c := b[i]
		if c == '"' {
			if pendingHigh {
				return i, "a lone UTF-16 surrogate (\\ud800–\\udbff without its pair)"
			}
			return i, ""
		}
		if c != '\\' || i+1 >= len(b) {
			if pendingHigh {
				return i, "a lone UTF-16 surrogate (\\ud800–\\udbff without its pair)"
			}
			continue
		}
		i++
		if b[i] != 'u' {
			if pendingHigh {
				return i, "a lone UTF-16 surrogate (\\ud800–\\udbff without its pair)"
			}
			continue
		}
		if i+4 >= len(b) {
			return i, "a truncated \\u escape"
		}
		v, err := strconv.ParseUint(string(b[i+1:i+5]), 16, 32)
		if err != nil {
			return i, "an invalid \\u escape"
		}
		i += 4
		switch {
		case v == 0:
			return i, "a NUL character (\\u0000), which the database cannot store"
		case v >= 0xD800 && v <= 0xDBFF:
			if pendingHigh {
				return i, "a lone UTF-16 surrogate (\\ud800–\\udbff without its pair)"
			}
			pendingHigh = true
		case v >= 0xDC00 && v <= 0xDFFF:
			if !pendingHigh {
				return i, "a lone UTF-16 surrogate (\\udc00–\\udfff without its pair)"
			}
			pendingHigh = false
		default:
			if pendingHigh {
				return i, "a lone UTF-16 surrogate (\\ud800–\\udbff without its pair)"
			}
		}
	}
	return i, ""
}

// numberProblem scans the number starting at i and returns the index just
// past it.
func numberProblem(b []byte, i int) (int, string) {
	if b[i] == '-' {
		i++
	}
	intDigits, fracDigits := 0, 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		intDigits++
	}
	if i < len(b) && b[i] == '.' {
		for i++; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			fracDigits++
		}
	}
	exp := int64(0)
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		neg := false
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			neg = b[i] == '-'
			i++
		}
		for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			if exp < 1<<40 {
				exp = exp*10 + int64(b[i]-'0')
			}
		}
		if neg {
			exp = -exp
		}
	}
	if int64(intDigits)+exp > maxNumericIntDigits || int64(fracDigits)-exp > maxNumericFracDigits {
		return i, fmt.Sprintf("a number beyond the database's range (more than %d digits before the point or %d after it)",
			maxNumericIntDigits, maxNumericFracDigits)
	}
	return i, ""
}
