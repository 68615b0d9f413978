package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// A batch is bounded by the rows it expands to, not by its records: a
// steps record carries the columns of many steps, each stored (and held in
// memory on the way) as a step record of its own. Every other record is
// one row.

// Rows is the number of rows r is stored as: one a step of a steps record,
// else one.
func (r Record) Rows() int {
	if r.Steps != nil {
		return len(r.Steps)
	}
	return 1
}

// RowsError refuses a batch that expands to more rows than its bound:
// Index (and Line, of an NDJSON body) is the record that passed it.
type RowsError struct {
	Max   int
	Index int
	Line  int
}

func (e *RowsError) Error() string {
	where := fmt.Sprintf("record %d", e.Index)
	if e.Line > 0 {
		where = fmt.Sprintf("line %d", e.Line)
	}
	return fmt.Sprintf("batch expands to more than %d rows (each step of a steps record is a row) at %s", e.Max, where)
}

// at places e, a record's error, at index i (line of an NDJSON body), or
// makes it the batch's RowsError when it says the record has too many rows.
func (e *RecordError) at(i, line, maxRows int) error {
	if e.rows {
		return &RowsError{Max: maxRows, Index: i, Line: line}
	}
	e.Index, e.Line = i, line
	return e
}

// stepRepeats tells the entries of a steps record's "step" that repeat an
// entry before them, by the text of their numbers: a step sent twice in
// one record is decoded and stored once, as the store keeps the first of a
// rank's step it is given, so a record repeating one step costs no more
// than its columns' text. Steps in increasing order, as senders write
// them, cost one comparison each and no set: the function is nil then. A
// number written two ways (7 and 7.0) is not told apart here; the store
// still keeps one of them.
func stepRepeats(steps []json.RawMessage) func(i int) bool {
	var last int64
	increasing := true
	for i, raw := range steps {
		n, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil || (i > 0 && n <= last) {
			increasing = false
			break
		}
		last = n
	}
	if increasing {
		return nil
	}
	seen := make(map[string]struct{}, len(steps))
	return func(i int) bool {
		k := string(bytes.TrimSpace(steps[i]))
		if _, ok := seen[k]; ok {
			return true
		}
		seen[k] = struct{}{}
		return false
	}
}
