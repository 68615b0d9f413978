package api

import (
	"bytes"
	"fmt"
)

// A large NDJSON body is decoded a line at a time rather than whole: its
// records are checked one after the other, each dropped once looked at, so
// that what a body costs is its bytes and one record, never every record it
// holds at once (see [EachNDJSON]). The ingest handler and the collector's
// hook receiver read large bodies this way.

// IsNDJSON reports whether body is an NDJSON body rather than a JSON
// array, as [DecodeBatch] tells them apart.
func IsNDJSON(body []byte) bool {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	return len(trimmed) > 0 && trimmed[0] != '['
}

// EachNDJSON decodes and validates the records of an NDJSON body in order,
// as [DecodeBatchWithin] does, handing each to fn with its 1-based line
// and its text (which aliases body) and keeping none of them. It stops at
// the first record DecodeBatchWithin would refuse, with the error it would
// answer (a *RecordError, a *RowsError past maxRows rows, [ErrEmptyBatch]
// for a body without records), or at the first error fn returns. It
// returns the records and the rows they expand to that it read.
//
// Given the same body it decides the same way every time, so a caller may
// check a body with a first pass whose fn keeps nothing, and then decode
// it again to keep its records a chunk at a time.
func EachNDJSON(body []byte, maxRows int, fn func(line int, raw []byte, rec Record) error) (records, rows int, err error) {
	maxRows = min(max(maxRows, 1), MaxBatchRecords)
	var fd fastDecoder
	for line, l := range NDJSONLines(body) {
		if records >= MaxBatchRecords {
			return records, rows, &RecordError{Index: records, Line: line, Msg: fmt.Sprintf("batch holds more than %d records", MaxBatchRecords)}
		}
		rec, ok := fd.record(l)
		if !ok {
			var rerr *RecordError
			rec, rerr = decodeRecordWithin(NormalizeJSON(l), maxRows-rows)
			if rerr != nil {
				return records, rows, rerr.at(records, line, maxRows)
			}
		}
		if rows += rec.Rows(); rows > maxRows {
			return records, rows, &RowsError{Max: maxRows, Index: records, Line: line}
		}
		records++
		if fn != nil {
			if err := fn(line, l, rec); err != nil {
				return records, rows, err
			}
		}
	}
	if records == 0 {
		return 0, 0, ErrEmptyBatch
	}
	return records, rows, nil
}
