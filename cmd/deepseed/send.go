package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/deepseed/deepseed/api"
)

// Bounds of one batch sent by import.
const (
	sendBatchRecords = 2000
	sendBatchBytes   = 4 << 20
)

// fileRecord is one record of an NDJSON file and the line it came from.
type fileRecord struct {
	line int
	raw  json.RawMessage
}

// ndjsonRecords reads the records of an NDJSON file: a line is a record,
// or a dead-letter entry whose records are unpacked. A file that is one
// JSON array of records, as POST /api/v1/ingest also takes, is read as
// its records. Blank lines are skipped; anything else is an error naming
// the line, in words.
func ndjsonRecords(file string, body []byte) ([]fileRecord, error) {
	if t := bytes.TrimSpace(body); len(t) > 0 && t[0] == '[' {
		var arr []json.RawMessage
		if err := json.Unmarshal(api.NormalizeJSON(t), &arr); err != nil {
			return nil, fmt.Errorf("%s: not a JSON array of records: %s", file, jsonProblem(err))
		}
		out := make([]fileRecord, 0, len(arr))
		for i, r := range arr {
			if t := bytes.TrimSpace(r); len(t) == 0 || t[0] != '{' {
				return nil, fmt.Errorf("%s: element %d of the array is not a JSON object: want records with a \"kind\"", file, i+1)
			}
			out = append(out, fileRecord{1, r})
		}
		return out, nil
	}
	var out []fileRecord
	for line, l := range api.NDJSONLines(body) {
		var head struct {
			Kind    *string           `json:"kind"`
			Records []json.RawMessage `json:"records"`
		}
		// Python's json writes NaN and Infinity bare; the server takes
		// them, and so does this reading.
		if err := json.Unmarshal(api.NormalizeJSON(l), &head); err != nil {
			return nil, fmt.Errorf("%s:%d: not a JSON record: %s", file, line, jsonProblem(err))
		}
		switch {
		case head.Kind != nil:
			out = append(out, fileRecord{line, json.RawMessage(l)})
		case head.Records != nil:
			for _, r := range head.Records {
				out = append(out, fileRecord{line, r})
			}
		default:
			return nil, fmt.Errorf("%s:%d: neither a record (no \"kind\") nor a dead-letter entry (no \"records\")", file, line)
		}
	}
	return out, nil
}

// jsonProblem says what is wrong with a JSON text in words: a truncated
// one as truncated, a value of the wrong shape by its JSON type, never
// by the Go type it was read into.
func jsonProblem(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn) && syn.Error() == "unexpected end of JSON input":
		return "it ends in the middle: the file is truncated (copy or write it again)"
	case errors.As(err, &syn):
		return fmt.Sprintf("%s (at byte %d)", syn.Error(), syn.Offset)
	case errors.As(err, &typ) && typ.Field == "":
		return "a JSON " + typ.Value + " where an object was expected"
	case errors.As(err, &typ):
		return fmt.Sprintf("field %q is a JSON %s, which it may not be", typ.Field, typ.Value)
	}
	return err.Error()
}

// sendRecords sends an NDJSON file's records to the ingest endpoint in
// bounded batches, retrying while the server is away, and says how far it
// got as it goes.
func sendRecords(ctx context.Context, target, token, file string, body []byte) error {
	recs, err := ndjsonRecords(file, body)
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	if len(recs) == 0 {
		return fmt.Errorf("import: %s holds no records", file)
	}
	stored, dups := 0, 0
	last := time.Now()
	for start := 0; start < len(recs); {
		end, size := start, 0
		for end < len(recs) && end-start < sendBatchRecords && (end == start || size+len(recs[end].raw) < sendBatchBytes) {
			size += len(recs[end].raw) + 1
			end++
		}
		var nd bytes.Buffer
		for _, r := range recs[start:end] {
			nd.Write(r.raw)
			nd.WriteByte('\n')
		}
		gz, err := gzipBytes(nd.Bytes())
		if err != nil {
			return fmt.Errorf("import: compress: %w", err)
		}
		res, err := postWithRetry(ctx, target, token, gz)
		if err != nil {
			var ref *refusal
			if errors.As(err, &ref) && ref.body.Record != nil && ref.body.Record.Index >= 0 && start+ref.body.Record.Index < end {
				bad := recs[start+ref.body.Record.Index]
				return fmt.Errorf("import: %s:%d: the server refused the record: %s (the %d records before this batch are stored; fix the line and send the file again, what is stored is not stored twice)",
					file, bad.line, ref.body.Error, start)
			}
			return fmt.Errorf("import: %s: records %d to %d: %w (the %d records before them are stored; sending the file again is safe)", file, start+1, end, err, start)
		}
		stored += res.Accepted
		dups += res.Duplicates
		start = end
		if time.Since(last) >= time.Second || start == len(recs) {
			fmt.Fprintf(os.Stderr, "%s: %d/%d records sent\n", file, start, len(recs))
			last = time.Now()
		}
	}
	fmt.Fprintf(os.Stderr, "imported %s: %d records, %d stored, %d already there\n", file, len(recs), stored, dups)
	return nil
}

func gzipBytes(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
