package api

import (
	"bytes"
	"encoding/json"
)

// DuplicateKey returns the first key that appears twice in one object of
// the JSON text raw (its first 64 bytes, for a message), or "" when none
// does. encoding/json keeps the last of
// repeated keys and other readers the first, so a record that repeats one
// says two things: it is refused rather than read one way. Keys compare as
// the strings they decode to ("a" and "\u0061" are one key). raw must be
// syntactically valid JSON (bare NaN and Infinity are skipped like
// numbers). One pass, no allocation for keys without escapes in objects
// of up to wideObject keys, linear in the keys of wider ones.
func DuplicateKey(raw []byte) string {
	// Offsets, not slices, so the buffers stay on the stack: a record's
	// usual keys and depth cost no allocation.
	var keyBuf [48]span
	var frameBuf [8]frame
	keys, frames := keyBuf[:0], frameBuf[:0]
	expectKey := false
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; c {
		case '{', '[':
			frames = append(frames, frame{start: len(keys), obj: c == '{'})
			expectKey = c == '{'
		case '}', ']':
			if n := len(frames); n > 0 {
				keys = keys[:frames[n-1].start]
				frames = frames[:n-1]
			}
			expectKey = false
		case ',':
			expectKey = len(frames) > 0 && frames[len(frames)-1].obj
		case '"':
			end := len(raw) // an unclosed string runs to the end
			if e, ok := skipString(raw, i); ok {
				end = e - 1 // its closing quote
			}
			if expectKey {
				key := span{from: int32(i + 1), to: int32(end), escaped: bytes.IndexByte(raw[i+1:end], '\\') >= 0}
				f := &frames[len(frames)-1]
				if f.set != nil {
					k := key.full(raw)
					if _, dup := f.set[k]; dup {
						return key.text(raw)
					}
					f.set[k] = struct{}{}
					expectKey = false
					i = end
					continue
				}
				// A key whose bit is not yet set is new: most keys of a
				// record are compared with none of the others.
				bit := key.bit(raw)
				if f.seen&bit != 0 || key.escaped || f.escaped {
					for _, k := range keys[f.start:] {
						if k.same(raw, key) {
							return key.text(raw)
						}
					}
				}
				f.seen |= bit
				f.escaped = f.escaped || key.escaped
				keys = append(keys, key)
				if len(keys)-f.start > wideObject {
					// Compared with every key before it, each new key of
					// a wide object would cost its width: a set keeps
					// one pass linear.
					f.set = make(map[string]struct{}, 2*wideObject)
					for _, k := range keys[f.start:] {
						f.set[k.full(raw)] = struct{}{}
					}
					keys = keys[:f.start]
				}
				expectKey = false
			}
			i = end
		}
	}
	return ""
}

// span is a key's body in the JSON text: raw[from:to].
type span struct {
	from, to int32
	escaped  bool // holds a backslash escape
}

// text is the key as it decodes, at most 64 bytes of it.
func (s span) text(raw []byte) string {
	k := s.full(raw)
	return k[:min(len(k), 64)]
}

// full is the key as it decodes.
func (s span) full(raw []byte) string {
	k := string(raw[s.from:s.to])
	if s.escaped {
		_ = json.Unmarshal(raw[s.from-1:s.to+1], &k)
	}
	return k
}

// wideObject is the most keys of one object DuplicateKey compares with
// one another; past it the object's keys go in a set.
const wideObject = 32

// same reports whether two keys decode to the same string: byte for byte
// unless one holds an escape.
func (s span) same(raw []byte, o span) bool {
	if !s.escaped && !o.escaped {
		return bytes.Equal(raw[s.from:s.to], raw[o.from:o.to])
	}
	var a, b string
	return json.Unmarshal(raw[s.from-1:s.to+1], &a) == nil && json.Unmarshal(raw[o.from-1:o.to+1], &b) == nil && a == b
}

// bit is one of 64 bits chosen by the key's length and last byte: equal
// keys without escapes have the same one.
func (s span) bit(raw []byte) uint64 {
	n := s.to - s.from
	last := byte(0)
	if n > 0 {
		last = raw[s.to-1]
	}
	return 1 << ((uint(n)*7 + uint(last)) & 63)
}

// frame is an open object (its keys start at keys[start]) or array, with
// the bits of its keys so far and whether one of them holds an escape.
type frame struct {
	start   int
	seen    uint64
	obj     bool
	escaped bool
	set     map[string]struct{} // the keys of a wide object, decoded
}
