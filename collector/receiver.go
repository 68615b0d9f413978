package collector

import (
	"bytes"
	"context"
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
	body, lease, herr := httplimit.ReadBodyStream(r, c.cfg.HTTP.MaxBodyBytes)
	defer lease.Release()
	if herr != nil {
		c.m.hookRejected.Inc()
		writeLimitError(w, herr)
		return
	}
	// Announcements stay here; the rest is forwarded as the hook wrote it.
	var b hookBatch
	var err error
	if api.IsNDJSON(body) {
		err = b.lines(r.Context(), body, lease, c.cfg.HTTP.MaxBatchRows)
	} else {
		err = b.array(r.Context(), body, lease, c.cfg.HTTP.MaxBatchRows)
	}
	if err != nil {
		c.m.hookRejected.Inc()
		var le *httplimit.Error
		if errors.As(err, &le) {
			writeLimitError(w, le)
			return
		}
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
	for _, p := range b.procs {
		c.reg.announce(p)
		c.log.Info("training process announced", "pid", p.PID, "run_id", p.RunID, "rank", p.Rank)
	}
	fwd := b.fwd
	for _, ev := range b.hangs {
		if g := c.hangGPUs(ev); g != nil {
			fwd = append(fwd, g)
		}
	}
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
	c.m.received.Add(b.records)
	// What json.Encoder writes for {"accepted": n}, without building a map
	// for every request.
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	var ans [32]byte
	w.Write(append(strconv.AppendInt(append(ans[:0], `{"accepted":`...), int64(b.records), 10), "}\n"...))
}

// hookBatch is a validated body of the hook's: the records to forward,
// each the compact JSON text the hook wrote, and the process announcements
// and hang reports the collector acts on itself.
type hookBatch struct {
	records int
	fwd     [][]byte
	procs   []*api.Process
	hangs   []*api.Event
}

func (b *hookBatch) add(raw []byte, rec api.Record) {
	b.records++
	if rec.Process != nil {
		b.procs = append(b.procs, rec.Process)
		return
	}
	b.fwd = append(b.fwd, raw)
	if ev := rec.Event; ev != nil && ev.Type == api.EventHang {
		b.hangs = append(b.hangs, ev)
	}
}

// lines validates an NDJSON body a line at a time (api.EachNDJSON): what
// it keeps of a record is its line, which aliases body, so a large body
// costs its bytes and one record at a time, never all of them decoded.
// Nothing is acted on until every line is checked. A steps record is
// decoded into its rows, which are held in the lease while it is looked at.
func (b *hookBatch) lines(ctx context.Context, body []byte, lease *httplimit.Lease, maxRows int) error {
	_, _, err := api.EachNDJSON(body, maxRows, func(_ int, raw []byte, rec api.Record) error {
		if rec.Steps != nil {
			if herr := lease.Room(ctx, httplimit.WholeRoom(len(raw), rec.Rows())); herr != nil {
				return herr
			}
		}
		b.add(raw, rec)
		return nil
	})
	return err
}

// array validates a JSON array body, decoded whole within the lease, and
// keeps each record's compact text.
func (b *hookBatch) array(ctx context.Context, body []byte, lease *httplimit.Lease, maxRows int) error {
	if herr := lease.Room(ctx, httplimit.WholeRoom(len(body), 0)); herr != nil {
		return herr
	}
	recs, err := api.DecodeBatchWithin(body, maxRows)
	if err != nil {
		return err
	}
	// The rows are held until the spool has them: within the budget.
	rows := 0
	for _, rec := range recs {
		rows += rec.Rows()
	}
	if herr := lease.Room(ctx, httplimit.WholeRoom(len(body), rows)); herr != nil {
		return herr
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(api.NormalizeJSON(bytes.TrimLeft(body, " \t\r\n")), &raws); err != nil || len(raws) != len(recs) {
		// DecodeBatch accepted it, so this cannot happen; refuse rather
		// than forward records that do not match what was validated.
		return errors.New("body could not be split into records")
	}
	for i, r := range raws {
		var c bytes.Buffer
		if err := json.Compact(&c, r); err != nil {
			return errors.New("body could not be split into records")
		}
		b.add(c.Bytes(), recs[i])
	}
	return nil
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
