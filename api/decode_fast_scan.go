package api

import "unicode/utf8"

// The fast decoder's scanner: moving over the bytes of a record, its
// punctuation and whitespace, strings without escapes (interned where
// they repeat), object keys and the separators between members.

func (d *fastDecoder) peek() byte {
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

func (d *fastDecoder) eat(c byte) bool {
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// ws skips JSON whitespace.
func (d *fastDecoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// rawString reads a string without escapes and returns its bytes, which
// alias the input. Invalid UTF-8 gives up: encoding/json would replace it.
func (d *fastDecoder) rawString() ([]byte, bool) {
	if d.peek() != '"' {
		return nil, false
	}
	start := d.i + 1
	ascii := true
	for j := start; j < len(d.b); j++ {
		c := d.b[j]
		switch {
		case c == '"':
			s := d.b[start:j]
			if !ascii && !utf8.Valid(s) {
				return nil, false
			}
			d.i = j + 1
			return s, true
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, false
}

func (d *fastDecoder) intern(b []byte) string {
	if s, ok := d.strs[string(b)]; ok {
		return s
	}
	s := string(b)
	if d.strs == nil {
		d.strs = make(map[string]string, 64)
	}
	if len(d.strs) < maxInterned {
		d.strs[s] = s
	}
	return s
}

func (d *fastDecoder) str() (string, bool) {
	b, ok := d.rawString()
	if !ok {
		return "", false
	}
	return d.intern(b), true
}

// key reads an object key and the colon after it.
func (d *fastDecoder) key() ([]byte, bool) {
	k, ok := d.rawString()
	if !ok {
		return nil, false
	}
	d.ws()
	if !d.eat(':') {
		return nil, false
	}
	d.ws()
	return k, true
}

// next moves past the separator after a member: more is true at a comma
// (and the next key follows), false at the closing brace.
func (d *fastDecoder) next() (more, ok bool) {
	d.ws()
	switch d.peek() {
	case ',':
		d.i++
		d.ws()
		return true, true
	case '}':
		d.i++
		return false, true
	}
	return false, false
}
