package api

import (
	"bytes"
	"math"
	"strconv"
)

// The fast decoder's values: numbers in JSON syntax, integers, [Float]s
// (with their non-finite spellings), [Time]s, booleans, arrays of floats
// and strings and metrics objects, each read exactly as encoding/json
// would decode it into a record's field; and exactFloatPrefix, the exact
// shortcut for the common decimal literal.

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// number reads a number in JSON syntax and returns its literal.
func (d *fastDecoder) number() (lit []byte, isInt, ok bool) {
	b, j := d.b, d.i
	if j < len(b) && b[j] == '-' {
		j++
	}
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case j < len(b) && b[j] >= '1' && b[j] <= '9':
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	default:
		return nil, false, false
	}
	isInt = true
	if j < len(b) && b[j] == '.' {
		isInt = false
		j++
		if j >= len(b) || !isDigit(b[j]) {
			return nil, false, false
		}
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		isInt = false
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		if j >= len(b) || !isDigit(b[j]) {
			return nil, false, false
		}
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	}
	lit = b[d.i:j]
	d.i = j
	return lit, isInt, true
}

// int64Val reads an integer as encoding/json does for int fields.
func (d *fastDecoder) int64Val() (int64, bool) {
	lit, isInt, ok := d.number()
	if !ok || !isInt {
		return 0, false
	}
	digits := lit
	neg := lit[0] == '-'
	if neg {
		digits = lit[1:]
	}
	if len(digits) > 18 {
		v, err := strconv.ParseInt(string(lit), 10, 64)
		return v, err == nil
	}
	var v int64
	for _, c := range digits {
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}

// floatVal reads what [Float.UnmarshalJSON] accepts after [NormalizeJSON]:
// a number, or a bare or quoted NaN or infinity.
func (d *fastDecoder) floatVal() (Float, bool) {
	rest := d.b[d.i:]
	switch d.peek() {
	case '"':
		s, ok := d.rawString()
		if !ok || len(s) > len("-Infinity") {
			return 0, false
		}
		v, ok := ParseNonFinite(string(s))
		return Float(v), ok
	case 'N':
		if bytes.HasPrefix(rest, []byte("NaN")) {
			d.i += 3
			return Float(math.NaN()), true
		}
		return 0, false
	case 'I':
		if bytes.HasPrefix(rest, []byte("Infinity")) {
			d.i += 8
			return Float(math.Inf(1)), true
		}
		return 0, false
	case '-':
		if bytes.HasPrefix(rest, []byte("-Infinity")) {
			d.i += 9
			return Float(math.Inf(-1)), true
		}
	}
	v, n, exact := exactFloatPrefix(rest)
	if n == 0 {
		return 0, false
	}
	d.i += n
	if exact {
		return Float(v), true
	}
	v, err := strconv.ParseFloat(string(rest[:n]), 64)
	if err != nil {
		// As Float.UnmarshalJSON: out-of-range literals become ±Inf.
		if ne, ok := err.(*strconv.NumError); !ok || ne.Err != strconv.ErrRange {
			return 0, false
		}
	}
	return Float(v), true
}

// timeVal reads what [Time.UnmarshalJSON] accepts: an RFC 3339 string or
// Unix seconds.
func (d *fastDecoder) timeVal() (Time, bool) {
	start := d.i
	var lit []byte
	quoted := d.peek() == '"'
	if quoted {
		s, ok := d.rawString()
		if !ok {
			return Time{}, false
		}
		lit = s
	} else {
		l, _, ok := d.number()
		if !ok {
			return Time{}, false
		}
		lit = l
	}
	raw := d.b[start:d.i]
	if d.timeRaw != nil && bytes.Equal(raw, d.timeRaw) {
		return d.timeLast, true
	}
	var t Time
	if quoted {
		v, err := ParseTime(string(lit))
		if err != nil {
			return Time{}, false
		}
		t.Time = v
	} else {
		f, err := strconv.ParseFloat(string(lit), 64)
		if err != nil {
			return Time{}, false
		}
		v, err := UnixSeconds(f)
		if err != nil {
			return Time{}, false
		}
		t.Time = v
	}
	d.timeRaw = append(d.timeRaw[:0], raw...)
	d.timeLast = t
	return t, true
}

func (d *fastDecoder) boolVal() (bool, bool) {
	rest := d.b[d.i:]
	switch {
	case bytes.HasPrefix(rest, []byte("true")):
		d.i += 4
		return true, true
	case bytes.HasPrefix(rest, []byte("false")):
		d.i += 5
		return false, true
	}
	return false, false
}

func (d *fastDecoder) floatArray() ([]Float, bool) {
	if !d.eat('[') {
		return nil, false
	}
	d.ws()
	if d.eat(']') {
		return []Float{}, true
	}
	d.floats = d.floats[:0]
	for {
		// Past the bound the general path refuses the record unread.
		if len(d.floats) == MaxEntries {
			return nil, false
		}
		v, ok := d.floatVal()
		if !ok {
			return nil, false
		}
		d.floats = append(d.floats, v)
		d.ws()
		if d.eat(',') {
			d.ws()
			continue
		}
		if !d.eat(']') {
			return nil, false
		}
		break
	}
	return append([]Float(nil), d.floats...), true
}

func (d *fastDecoder) stringArray() ([]string, bool) {
	start := d.i
	if n := len(d.lastStrsRaw); n > 0 && bytes.HasPrefix(d.b[start:], d.lastStrsRaw) {
		// The same text from '[' to ']' decodes to the same strings.
		d.i += n
		return d.lastStrs, true
	}
	if !d.eat('[') {
		return nil, false
	}
	d.ws()
	if d.eat(']') {
		return []string{}, true
	}
	d.strList = d.strList[:0]
	for {
		if len(d.strList) == MaxEntries {
			return nil, false
		}
		s, ok := d.str()
		if !ok {
			return nil, false
		}
		d.strList = append(d.strList, s)
		d.ws()
		if d.eat(',') {
			d.ws()
			continue
		}
		if !d.eat(']') {
			return nil, false
		}
		break
	}
	out := append([]string(nil), d.strList...)
	d.lastStrsRaw, d.lastStrs = d.b[start:d.i], out
	return out, true
}

func (d *fastDecoder) metrics() (map[string]Float, bool) {
	if !d.eat('{') {
		return nil, false
	}
	m := map[string]Float{}
	d.ws()
	if d.eat('}') {
		return m, true
	}
	for {
		k, ok := d.key()
		if !ok {
			return nil, false
		}
		v, ok := d.floatVal()
		if !ok {
			return nil, false
		}
		// A repeated key is refused, with its message, by the general
		// path, as is a map past its bound.
		n := len(m)
		if n == MaxMetrics {
			return nil, false
		}
		if m[d.intern(k)] = v; len(m) == n {
			return nil, false
		}
		more, ok := d.next()
		if !ok {
			return nil, false
		}
		if !more {
			return m, true
		}
	}
}

// pow10 holds the powers of ten that float64 represents exactly.
var pow10 = [...]float64{1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10,
	1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22}

// exactFloatPrefix finds the JSON number at the start of lit and returns
// its length n, 0 when lit does not start with one (a leading zero
// followed by digits, a dot or an exponent without digits).
//
// Most metrics are numbers whose digits, read as an integer, are at most
// 2^53, with a small decimal exponent. Those digits fit a float64 exactly,
// as does a power of ten up to 1e22, and one multiplication or division
// rounds correctly: for such a number it also returns the value, which is
// strconv.ParseFloat's, and exact true. For any other the caller converts
// lit[:n] the general way, without scanning it again.
func exactFloatPrefix(lit []byte) (f float64, n int, exact bool) {
	i := 0
	neg := false
	if i < len(lit) && lit[i] == '-' {
		neg = true
		i++
	}
	// mant takes significant digits while it is at most 2^53; past that
	// the number is inexact, and the scan only finds where it ends.
	var mant uint64
	inexact := false
	exp := 0
	switch {
	case i < len(lit) && lit[i] == '0':
		i++
	case i < len(lit) && lit[i] >= '1' && lit[i] <= '9':
		for ; i < len(lit) && isDigit(lit[i]); i++ {
			if mant = mant*10 + uint64(lit[i]-'0'); mant > 1<<53 {
				inexact = true
				for i++; i < len(lit) && isDigit(lit[i]); i++ {
				}
				break
			}
		}
	default:
		return 0, 0, false
	}
	if i < len(lit) && lit[i] == '.' {
		i++
		if i >= len(lit) || !isDigit(lit[i]) {
			return 0, 0, false
		}
		for ; i < len(lit) && isDigit(lit[i]); i++ {
			if inexact {
				continue
			}
			if mant = mant*10 + uint64(lit[i]-'0'); mant > 1<<53 {
				inexact = true
			}
			exp--
		}
	}
	if i < len(lit) && (lit[i] == 'e' || lit[i] == 'E') {
		i++
		eneg := false
		if i < len(lit) && (lit[i] == '+' || lit[i] == '-') {
			eneg = lit[i] == '-'
			i++
		}
		if i >= len(lit) || !isDigit(lit[i]) {
			return 0, 0, false
		}
		e := 0
		for ; i < len(lit) && isDigit(lit[i]); i++ {
			if e < 100000 {
				e = e*10 + int(lit[i]-'0')
			}
		}
		if eneg {
			e = -e
		}
		exp += e
	}
	f = float64(mant)
	switch {
	case inexact:
		return 0, i, false
	case mant == 0:
	case exp >= 0 && exp < len(pow10):
		f *= pow10[exp]
	case exp < 0 && -exp < len(pow10):
		f /= pow10[-exp]
	default:
		return 0, i, false
	}
	if neg {
		f = -f
	}
	return f, i, true
}
