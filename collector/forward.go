package collector

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// sendError is a failed send. Permanent ones (a 4xx other than 408 and
// 429) are not retried: the batch goes to the dead-letter file.
type sendError struct {
	status     int
	msg        string
	permanent  bool
	retryAfter time.Duration
}

// transient reports whether the failure says nothing about the batch: no
// answer, the server or its database away, asked to slow down, or the
// collector's token refused (fixed on the collector's side, after which
// the same records must go through).
func (e *sendError) transient() bool {
	switch e.status {
	case 0, http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout,
		http.StatusTooManyRequests, http.StatusRequestTimeout, http.StatusUnauthorized, http.StatusForbidden:
		return true
	}
	return false
}

func (e *sendError) Error() string {
	if e.status == 0 {
		return e.msg
	}
	return fmt.Sprintf("server answered %d: %s", e.status, e.msg)
}

// forwarder posts batches to the server's ingest endpoint.
type forwarder struct {
	url    string // …/api/v1/ingest
	token  string
	client *http.Client

	gzMu sync.Mutex
	gz   *gzip.Writer
	buf  bytes.Buffer
}

func (f *forwarder) send(ctx context.Context, ndjson []byte) error {
	f.gzMu.Lock()
	f.buf.Reset()
	if f.gz == nil {
		f.gz, _ = gzip.NewWriterLevel(&f.buf, gzip.BestSpeed)
	} else {
		f.gz.Reset(&f.buf)
	}
	f.gz.Write(ndjson)
	f.gz.Close()
	body := append([]byte(nil), f.buf.Bytes()...)
	f.gzMu.Unlock()

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.url, bytes.NewReader(body))
	if err != nil {
		return &sendError{msg: err.Error(), permanent: true}
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("Content-Encoding", "gzip")
	if f.token != "" {
		req.Header.Set("Authorization", "Bearer "+f.token)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return &sendError{msg: err.Error()}
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	se := &sendError{status: resp.StatusCode, msg: serverMessage(msg)}
	switch {
	case resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			se.retryAfter = min(time.Duration(s)*time.Second, maxBackoff)
		}
	default:
		// A refusal of the batch (400, 413, 422 …): it is split, and what
		// the server still refuses goes to the dead-letter file. 401 and
		// 403 are about the collector, not the records: retried.
		se.permanent = resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden
	}
	return se
}

// serverMessage pulls the error message out of a JSON answer, or keeps
// the text as it came.
func serverMessage(b []byte) string {
	var e struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	if json.Unmarshal(b, &e) == nil {
		if e.Error != "" {
			return e.Error
		}
		if e.Message != "" {
			return e.Message
		}
	}
	return strings.TrimSpace(string(b))
}

const maxBackoff = 30 * time.Second

// minBackoff is the first wait after a failed send (a variable for tests).
var minBackoff = 250 * time.Millisecond

// backoff is exponential with full jitter in its upper half, so that many
// collectors coming back after an outage do not retry in step.
func backoff(attempt int) time.Duration {
	d := minBackoff << min(attempt, 10)
	if d > maxBackoff {
		d = maxBackoff
	}
	return d/2 + rand.N(d/2+1)
}

// deadLetter is an append-only file of batches the server refused, one
// JSON object per line with the server's answer and the records.
type deadLetter struct {
	path string
	mu   sync.Mutex
}

func (d *deadLetter) write(now time.Time, b *batch, se *sendError) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var recs []json.RawMessage
	for _, line := range bytes.Split(bytes.TrimRight(b.Body, "\n"), []byte("\n")) {
		if json.Valid(line) {
			recs = append(recs, json.RawMessage(line))
		} else {
			s, _ := json.Marshal(string(line))
			recs = append(recs, s)
		}
	}
	entry, err := json.Marshal(struct {
		Time    string            `json:"time"`
		Status  int               `json:"status"`
		Message string            `json:"message"`
		Batch   uint64            `json:"batch"`
		Records []json.RawMessage `json:"records"`
	}{now.UTC().Format(time.RFC3339Nano), se.status, se.msg, b.Seq, recs})
	if err != nil {
		return fmt.Errorf("dead-letter: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(d.path), 0o750); err != nil {
		return fmt.Errorf("dead-letter: %w", err)
	}
	_, statErr := os.Stat(d.path)
	f, err := os.OpenFile(d.path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o640)
	if err != nil {
		return fmt.Errorf("dead-letter: %w", err)
	}
	if _, err := f.Write(append(entry, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("dead-letter: %w", err)
	}
	// The records leave the spool once this returns: they must be on disk
	// first, as the spool's own files are (and the file's name in its
	// directory, the first time).
	if !noSync {
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("dead-letter: sync: %w", err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("dead-letter: %w", err)
	}
	if os.IsNotExist(statErr) && !noSync {
		if err := syncDir(filepath.Dir(d.path)); err != nil {
			return fmt.Errorf("dead-letter: %w", err)
		}
	}
	return nil
}

var errStopped = errors.New("collector stopped")

// burstLog says when a run of drops begins: the first drop after a quiet
// minute is logged with the records dropped since the last line, so a
// full spool writes a line a minute, not a line a batch.
type burstLog struct {
	mu      sync.Mutex
	last    time.Time
	pending int
}

// note counts n dropped records and reports whether to log now, with the
// records to report.
func (l *burstLog) note(now time.Time, n int) (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending += n
	if !l.last.IsZero() && now.Sub(l.last) < time.Minute {
		return 0, false
	}
	total := l.pending
	l.last, l.pending = now, 0
	return total, true
}
