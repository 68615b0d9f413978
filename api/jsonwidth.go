package api

import (
	"fmt"
	"strings"
)

// A record's bytes are bounded by the body, but what they decode to is
// not: a 30 MiB array of short strings or numbers, or an object of a
// million keys, takes ten to fifty times its bytes once decoded, and the
// per-field bounds (MaxLayers, MaxMetrics, MaxTags, …) are only checked
// after decoding. wideContainer counts the entries of every array and
// object in one pass without allocating, so a record holding one with
// more entries than any of its fields may have is refused before it is
// decoded.

// MaxEntries is the most entries an array or object of a record may hold
// (the largest of the per-field bounds, MaxLayers), apart from the
// columns of a steps record, which hold up to the batch's rows, and what
// config, params and summary hold, which are kept as the bytes sent.
const MaxEntries = MaxLayers

// rawFields are the fields of a record kept as the JSON text sent (and
// bounded by MaxJSONObject bytes): what they hold is not decoded, so it
// is not counted.
var rawFields = map[string]bool{"config": true, "params": true, "summary": true}

// widthFrame is an open array or object of wideContainer's scan.
type widthFrame struct {
	commas int
	obj    bool
	skip   bool
	field  string // the record's field the container is in
}

// maxDepth is the deepest nesting of arrays and objects wideContainer
// follows: no record comes near it, and the scan's stack stays small.
const maxDepth = 256

// wideContainer finds the first array or object in raw, a syntactically
// valid JSON text, with more than limit entries (limit commas or more),
// or nested more than maxDepth deep: it returns the record's field it is
// in ("" for raw itself) and why it is refused, or "", "" when there is
// none. The containers within a record's raw fields (rawFields) are not
// counted.
func wideContainer(raw []byte, limit int) (field, why string) {
	var buf [16]widthFrame
	frames := buf[:0]
	expectKey := false
	key := "" // the record's field being read
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; c {
		case '{', '[':
			f := widthFrame{obj: c == '{'}
			switch n := len(frames); {
			case n == 1 && frames[0].obj:
				// A field's value in the record object.
				f.field, f.skip = key, rawFields[key]
			case n > 1:
				f.field, f.skip = frames[n-1].field, frames[n-1].skip
			}
			if len(frames) == maxDepth {
				return f.field, fmt.Sprintf("nested more than %d deep", maxDepth)
			}
			frames = append(frames, f)
			expectKey = f.obj
		case '}', ']':
			if n := len(frames); n > 0 {
				frames = frames[:n-1]
			}
			expectKey = false
		case ',':
			if n := len(frames); n > 0 {
				f := &frames[n-1]
				f.commas++
				if !f.skip && f.commas+1 > limit {
					return f.field, fmt.Sprintf("more than %d entries", limit)
				}
				expectKey = f.obj
			}
		case '"':
			end, ok := skipString(raw, i)
			if !ok {
				return "", ""
			}
			if expectKey {
				if len(frames) == 1 {
					key = string(raw[i+1 : end-1])
				}
				expectKey = false
			}
			i = end - 1
		}
	}
	return "", ""
}

// arrayPast reports whether the JSON array raw holds more than limit
// entries at its top level, counted without decoding them.
func arrayPast(raw []byte, limit int) bool {
	depth, commas := 0, 0
	for i := 0; i < len(raw); i++ {
		switch raw[i] {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		case ',':
			if depth == 1 {
				if commas++; commas+1 > limit {
					return true
				}
			}
		case '"':
			end, ok := skipString(raw, i)
			if !ok {
				return false
			}
			i = end - 1
		}
	}
	return false
}

// tooWide refuses a record holding an array or object with more entries
// than any of its fields may have, before it is decoded: MaxEntries, or
// for a steps record, whose columns hold a batch's rows, the rows the
// batch has left (a rows error) when that is more. kind is the record's
// kind, "" when it is not a string.
func tooWide(raw []byte, kind string, maxRows int) *RecordError {
	steps := kind == KindSteps
	limit := MaxEntries
	if steps {
		limit = max(limit, maxRows)
	}
	field, why := wideContainer(raw, limit)
	if why == "" {
		return nil
	}
	re := &RecordError{Kind: truncate(kind, 40), Field: field, Msg: why}
	if steps && strings.HasPrefix(why, "more than") {
		re.rows = true
	}
	return re
}
