package collector

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/httplimit"
)

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
	// The same bounds as the server's ingest: the body is read as it
	// arrives, within --max-body-bytes before and after decompression, and
	// decompressions share the process's few slots.
	body, lease, herr := httplimit.ReadBodyLease(r, c.cfg.HTTP.MaxBodyBytes)
	defer lease.Release()
	if herr != nil {
		c.m.hookRejected.Inc()
		writeLimitError(w, herr)
		return
	}
	recs, err := api.DecodeBatchWithin(body, c.cfg.HTTP.MaxBatchRows)
	if err != nil {
		c.m.hookRejected.Inc()
		if herr := httplimit.TooManyRows(err); herr != nil {
			writeJSONError(w, herr.Status, herr.Msg)
			return
		}
		var re *api.RecordError
		if errors.As(err, &re) {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": re.Error(), "record": re})
			return
		}
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	// The rows are held until the spool has them: within the budget.
	rows := 0
	for _, rec := range recs {
		rows += rec.Rows()
	}
	if herr := lease.Grow(r.Context(), int64(rows)*httplimit.RowBytes); herr != nil {
		c.m.hookRejected.Inc()
		writeLimitError(w, herr)
		return
	}
	raws, err := rawRecords(body, len(recs))
	if err != nil || len(raws) != len(recs) {
		// DecodeBatch accepted it, so this cannot happen; refuse rather
		// than forward records that do not match what was validated.
		c.m.hookRejected.Inc()
		writeJSONError(w, http.StatusBadRequest, "body could not be split into records")
		return
	}
	// Announcements stay here; the rest is forwarded as the hook wrote it.
	fwd := raws[:0]
	var extra [][]byte
	for i, rec := range recs {
		if rec.Process != nil {
			c.reg.announce(rec.Process)
			c.log.Info("training process announced", "pid", rec.Process.PID, "run_id", rec.Process.RunID, "rank", rec.Process.Rank)
			continue
		}
		fwd = append(fwd, raws[i])
		if ev := rec.Event; ev != nil && ev.Type == api.EventHang {
			if b := c.hangGPUs(ev); b != nil {
				extra = append(extra, b)
			}
		}
	}
	// Added after the loop: fwd shares raws' array, whose next records
	// the loop still reads.
	fwd = append(fwd, extra...)
	// Acknowledged means on disk: the records are written and synced to
	// the spool (with those of the requests arriving meanwhile) before the
	// answer. A spool that cannot take them answers 503, and the hook keeps
	// them and sends them again.
	if c.fwd != nil && len(fwd) > 0 {
		if err := c.hook.commit(fwd); err != nil {
			c.m.hookFull.Inc()
			if total, ok := c.fullLog.note(c.now(), len(fwd)); ok {
				c.log.Warn("spool cannot take the hook's records: answering 503 until it can", "records", total, "err", err)
			}
			w.Header().Set("Retry-After", "1")
			msg := "the collector's spool is full (the server has been away); keep the records and retry"
			if !errors.Is(err, errSpoolFull) {
				msg = "the collector could not write its spool (" + err.Error() + "); keep the records and retry"
			}
			writeJSONError(w, http.StatusServiceUnavailable, msg)
			return
		}
	}
	c.m.received.Add(len(recs))
	// What json.Encoder writes for {"accepted": n}, without building a map
	// for every request.
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	var ans [32]byte
	w.Write(append(strconv.AppendInt(append(ans[:0], `{"accepted":`...), int64(len(recs)), 10), "}\n"...))
}

// rawRecords splits a validated body into one compact JSON text per record,
// in the order DecodeBatch decoded them, so that records are forwarded as
// the hook wrote them.
func rawRecords(body []byte, n int) ([][]byte, error) {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	out := make([][]byte, 0, n)
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
	for _, l := range api.NDJSONLines(body) {
		out = append(out, l)
	}
	return out, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// writeLimitError answers a body refused by httplimit, with its Retry-After.
func writeLimitError(w http.ResponseWriter, herr *httplimit.Error) {
	if herr.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(herr.RetryAfter))
	}
	writeJSONError(w, herr.Status, herr.Error())
}

func writeJSONError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// hangGPUs is an event beside a rank's hang report, on its run, rank and
// step: the newest reading of each of this node's GPUs as the last sample
// has it (utilisation, memory, clocks, power, temperature, throttle
// reasons, XIDs, ECC and remapped rows, the processes on it), as JSON
// {"host": ..., "gpus": [GPU record, ...]}. Nil without GPU sampling.
func (c *Collector) hangGPUs(ev *api.Event) []byte {
	c.snapMu.Lock()
	gpus := make([]api.GPU, 0, len(c.gpus))
	for _, g := range c.gpus {
		gpus = append(gpus, g.rec)
	}
	c.snapMu.Unlock()
	if len(gpus) == 0 {
		return nil
	}
	text, err := json.Marshal(struct {
		Host string    `json:"host"`
		GPUs []api.GPU `json:"gpus"`
	}{c.cfg.HostName, gpus})
	if err != nil {
		return nil
	}
	b, err := json.Marshal(&api.Event{Kind: api.KindEvent, RunID: ev.RunID, Time: api.T(c.now()), Step: ev.Step,
		Rank: ev.Rank, Type: api.EventHangGPUs, Text: string(text)})
	if err != nil {
		return nil
	}
	return b
}
