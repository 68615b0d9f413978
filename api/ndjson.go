package api

import (
	"bytes"
	"iter"
)

// NDJSONLines yields the records of an NDJSON body: each line split on
// '\n' as [bufio.ScanLines] splits them, trimmed of white space, blank
// lines skipped, with its 1-based line number in body. The lines alias
// body; nothing is copied.
//
// Every reader of NDJSON in DeepSeed (the ingest decoder, the collector's
// receiver and forwarder, deepseed import) splits lines here, so that they
// agree on which line a record came from.
func NDJSONLines(body []byte) iter.Seq2[int, []byte] {
	return func(yield func(int, []byte) bool) {
		line := 0
		for rest := body; len(rest) > 0; {
			var l []byte
			l, rest, _ = bytes.Cut(rest, []byte{'\n'})
			line++
			if l = bytes.TrimSpace(l); len(l) == 0 {
				continue
			}
			if !yield(line, l) {
				return
			}
		}
	}
}
