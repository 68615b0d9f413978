package collector

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/deepseed/deepseed/api"
)

// maxHookBody bounds a hook request body after decompression, as the
// server's ingest does.
const maxHookBody = 32 << 20

// ServeHTTP is the hook receiver: POST /api/v1/ingest with the same body
// as the server's ingest (NDJSON or a JSON array, optionally gzip). It
// validates the batch, keeps process announcements, queues the rest and
// answers at once; the training process never waits for the server.
func (c *Collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/v1/ingest" {
		writeJSONError(w, http.StatusNotFound, "not found: the hook receiver serves POST /api/v1/ingest")
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSONError(w, http.StatusMethodNotAllowed, "method not allowed: use POST")
		return
	}
	body, status, err := readBody(w, r)
	if err != nil {
		c.m.hookRejected.Inc()
		writeJSONError(w, status, err.Error())
		return
	}
	recs, err := api.DecodeBatch(body)
	if err != nil {
		c.m.hookRejected.Inc()
		var re *api.RecordError
		if errors.As(err, &re) {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": re.Error(), "record": re})
			return
		}
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	raws, err := rawRecords(body)
	if err != nil || len(raws) != len(recs) {
		// DecodeBatch accepted it, so this cannot happen; refuse rather
		// than forward records that do not match what was validated.
		c.m.hookRejected.Inc()
		writeJSONError(w, http.StatusBadRequest, "body could not be split into records")
		return
	}
	now := c.now()
	accepted := 0
	for i, rec := range recs {
		if rec.Process != nil {
			c.reg.announce(rec.Process)
			c.log.Info("training process announced", "pid", rec.Process.PID, "run_id", rec.Process.RunID, "rank", rec.Process.Rank)
			accepted++
			continue
		}
		c.enqueue(raws[i], now)
		accepted++
	}
	c.m.received.Add(len(recs))
	writeJSON(w, http.StatusOK, map[string]int{"accepted": accepted})
}

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, int, error) {
	var rd io.Reader = http.MaxBytesReader(w, r.Body, maxHookBody)
	switch strings.ToLower(r.Header.Get("Content-Encoding")) {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(rd)
		if err != nil {
			return nil, http.StatusBadRequest, fmt.Errorf("body is not valid gzip: %v", err)
		}
		defer zr.Close()
		rd = zr
	default:
		return nil, http.StatusUnsupportedMediaType, fmt.Errorf("unsupported Content-Encoding %q (want gzip or none)", r.Header.Get("Content-Encoding"))
	}
	// Read into a buffer sized from Content-Length when it is known, so a
	// plain body is read without regrowing.
	var buf bytes.Buffer
	if n := r.ContentLength; n > 0 && n <= maxHookBody && r.Header.Get("Content-Encoding") == "" {
		buf.Grow(int(n) + bytes.MinRead)
	}
	_, err := buf.ReadFrom(io.LimitReader(rd, maxHookBody+1))
	body := buf.Bytes()
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("body larger than %d bytes", maxHookBody)
		}
		return nil, http.StatusBadRequest, fmt.Errorf("reading body: %v", err)
	}
	if len(body) > maxHookBody {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("body larger than %d bytes after decompression", maxHookBody)
	}
	return body, 0, nil
}

// rawRecords splits a validated body into one compact JSON text per record,
// in the order DecodeBatch decoded them, so that records are forwarded as
// the hook wrote them.
func rawRecords(body []byte) ([][]byte, error) {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	var out [][]byte
	if len(trimmed) > 0 && trimmed[0] == '[' {
		var raws []json.RawMessage
		if err := json.Unmarshal(api.NormalizeJSON(trimmed), &raws); err != nil {
			return nil, err
		}
		for _, r := range raws {
			var b bytes.Buffer
			if err := json.Compact(&b, r); err != nil {
				return nil, err
			}
			out = append(out, b.Bytes())
		}
		return out, nil
	}
	// The same lines DecodeBatch read: split on '\n', blank ones skipped.
	// They alias body, which the receiver owns.
	for rest := body; len(rest) > 0; {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte{'\n'})
		if l := bytes.TrimSpace(line); len(l) > 0 {
			out = append(out, l)
		}
	}
	return out, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeJSONError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}
