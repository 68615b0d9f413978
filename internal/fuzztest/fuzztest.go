// Package fuzztest mutates valid request bodies into the hostile ones a
// live server must refuse with a 4xx: flipped bytes, spliced fragments,
// replaced values, truncations and repeated lines. Tests of the ingest and
// jobs APIs post what it makes to real servers.
package fuzztest

import (
	"bytes"
	"math/rand/v2"
	"strings"
)

// Inserts are fragments Mutate splices in: what broke a server once, and
// what might (NUL bytes, lone surrogates, invalid UTF-8, numbers out of
// range, deep nesting, a 70 KB string, SQL, JSON punctuation).
var Inserts = []string{
	`\u0000`, "\x00", `\ud800`, `\udc00x`, "\xff\xfe", `1e1000000`, `-1e-20000`, `1e309`, `99999999999999999999999999`,
	`"` + strings.Repeat("x", 70000) + `"`, strings.Repeat("[", 5000), strings.Repeat(`{"a":`, 3000), `NaN`, `-Infinity`,
	`'; DROP TABLE steps; --`, `null`, `true`, `{}`, `[]`, `"kind":"step"`, `,`, `:`, `"`, "\n", `\`,
}

// MutateSome returns a copy of b with one or more random mutations (the
// bound is drawn again before each further one); b is not changed.
func MutateSome(rng *rand.Rand, b []byte) []byte {
	for m := 0; m <= rng.IntN(3); m++ {
		b = Mutate(rng, b)
	}
	return b
}

// Mutate returns a copy of b with one random mutation; b is not changed.
func Mutate(rng *rand.Rand, b []byte) []byte {
	if len(b) == 0 {
		return b
	}
	at := rng.IntN(len(b))
	switch rng.IntN(5) {
	case 0: // flip a byte
		c := bytes.Clone(b)
		c[at] ^= byte(1 + rng.IntN(255))
		return c
	case 1: // splice a fragment in
		ins := Inserts[rng.IntN(len(Inserts))]
		return append(append(bytes.Clone(b[:at]), ins...), b[at:]...)
	case 2: // replace a value after a colon with a fragment
		i := bytes.IndexByte(b[at:], ':')
		if i < 0 {
			return b
		}
		j := at + i + 1
		end := j
		for end < len(b) && b[end] != ',' && b[end] != '}' && b[end] != ']' {
			end++
		}
		ins := Inserts[rng.IntN(len(Inserts))]
		return append(append(bytes.Clone(b[:j]), ins...), b[end:]...)
	case 3: // truncate
		return bytes.Clone(b[:at])
	default: // repeat a line
		lines := bytes.Split(b, []byte("\n"))
		l := lines[rng.IntN(len(lines))]
		return append(append(bytes.Clone(b), '\n'), l...)
	}
}
