package collector

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/deepseed/deepseed/api"
)

// The send loop: the oldest batches of the spool go to the server, as many
// at once as --batch-max-records and --batch-max-bytes allow, until they
// are settled, with backoff while the server fails, and a batch the server
// refuses is split down to the records it refuses, which go to the
// dead-letter file. The HTTP side is forward.go's forwarder.

// forwardLoop sends the oldest batches until ctx is done, backing off while
// the server fails.
func (c *Collector) forwardLoop(ctx context.Context) {
	attempt := 0
	failing := false
	// A batch the server keeps failing with the same error that is not the
	// database being away (a 500, say) is split like a refused one after
	// maxSameFailures tries, so that it cannot hold up the queue for good.
	var lastSeq uint64
	var lastErr string
	same := 0
	var buf []byte
	for {
		b, seqs := c.queue.next(c.cfg.BatchMaxBytes, c.cfg.BatchMaxRecords, buf)
		if b == nil {
			select {
			case <-ctx.Done():
				return
			case <-c.queue.wake:
			}
			continue
		}
		buf = b.Body[:0]
		split := same >= maxSameFailures-1 && b.Seq == lastSeq
		err := c.sendOne(ctx, b, split)
		if err == nil {
			c.queue.done(seqs)
			same = 0
			if failing {
				c.log.Info("server reachable again: sending the spool", "spool_batches", c.spool.len())
			}
			attempt, failing = 0, false
			continue
		}
		c.queue.retry(seqs)
		if ctx.Err() != nil {
			return
		}
		// Say it once per outage, not once per retry. A refused token
		// does not mend itself: say what to change.
		var seAuth *sendError
		switch {
		case !failing && errors.As(err, &seAuth) && (seAuth.status == http.StatusUnauthorized || seAuth.status == http.StatusForbidden):
			c.log.Error("the server refuses this collector's token: no record will be accepted until the collector is restarted "+
				"with an ingest token that the server's DEEPSEED_INGEST_TOKENS lists, in DEEPSEED_TOKEN or --token-file; "+
				"records wait in the spool meanwhile", "status", seAuth.status, "server_says", seAuth.msg, "records", b.N)
		case !failing:
			c.log.Warn("send failed: spooling and retrying with backoff", "records", b.N, "err", err)
		default:
			c.log.Debug("send failed again", "records", b.N, "err", err)
		}
		failing = true
		var se0 *sendError
		if errors.As(err, &se0) && !se0.transient() && b.Seq == lastSeq && err.Error() == lastErr {
			same++
		} else {
			same = 0
		}
		lastSeq, lastErr = b.Seq, err.Error()
		wait := backoff(attempt)
		var se *sendError
		if errors.As(err, &se) && se.retryAfter > 0 {
			wait = se.retryAfter
		}
		attempt++
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// maxSameFailures is how often a batch may fail the same non-transient
// way before it is split.
const maxSameFailures = 5

// sendOne sends b: acknowledged, or split by the server's refusal into
// what it takes and what goes to the dead-letter file; then the caller
// removes it from the spool. A retryable failure leaves it there. With
// split set, a batch failing the same way again is treated as refused.
func (c *Collector) sendOne(ctx context.Context, b *batch, split bool) error {
	err := c.fwd.send(ctx, b.Body)
	var se *sendError
	if err == nil {
		c.m.forwarded.Add(b.N)
	} else if errors.As(err, &se) && (se.permanent || (split && !se.transient())) {
		err = c.sendSplit(ctx, b.Seq, splitLines(b.Body), se)
	}
	if err == nil {
		c.m.lastSend.Store(c.now().UnixMilli())
		return nil
	}
	c.m.failed.Add(b.N)
	c.m.sendErrors.Inc()
	return err
}

// sendSplit settles the records of a batch the server refused: halves are
// sent on their own, down to single records, so that every record the
// server takes arrives and only those it refuses go to the dead-letter
// file. A retryable failure on the way stops it: the whole batch stays in
// the spool, and the halves already sent are duplicates the server drops
// when it comes again.
func (c *Collector) sendSplit(ctx context.Context, seq uint64, lines [][]byte, refusal *sendError) error {
	if len(lines) == 1 {
		b := &batch{Seq: seq, N: 1, Body: append(append([]byte(nil), lines[0]...), '\n')}
		if derr := c.dead.write(c.now(), b, refusal); derr != nil {
			c.log.Error("server refused a record and the dead-letter file could not be written", "status", refusal.status, "message", refusal.msg, "err", derr)
		} else {
			c.log.Error("server refused a record: written to the dead-letter file", "status", refusal.status, "message", refusal.msg, "file", c.dead.path)
		}
		c.m.deadLettered.Inc()
		return nil
	}
	for _, half := range [][][]byte{lines[:len(lines)/2], lines[len(lines)/2:]} {
		err := c.fwd.send(ctx, joinLines(half))
		if err == nil {
			c.m.forwarded.Add(len(half))
			continue
		}
		var se *sendError
		if !errors.As(err, &se) || !(se.permanent || se.status == refusal.status && !se.transient()) {
			return err
		}
		if err := c.sendSplit(ctx, seq, half, se); err != nil {
			return err
		}
	}
	return nil
}

func splitLines(body []byte) [][]byte {
	var out [][]byte
	for _, l := range api.NDJSONLines(body) {
		out = append(out, l)
	}
	return out
}

func joinLines(lines [][]byte) []byte {
	var b []byte
	for _, l := range lines {
		b = append(append(b, l...), '\n')
	}
	return b
}
