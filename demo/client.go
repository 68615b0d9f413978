// Package demo writes realistic simulated training runs through the
// public ingest API, so that a fresh DeepSeed shows every chart and
// reproduces the comparison tables of the experiment report. The runs
// themselves are one shape of the synthetic-run generator,
// fleettest.DemoRuns(anchor): every simulated run, deterministic for a
// given anchor hour; this package posts them:
//
//	res, err := demo.Load(ctx, demo.Options{Server: url, Token: t, Progress: os.Stderr})
//
// Run ids are fixed and the timeline ends at the hour of the first load, so
// that Grafana's default "last 7 days" shows the runs. Loading again skips
// every run the server already holds as finished; a run left unfinished by
// an interrupted load is written again, and ingest deduplicates what it
// already stored within the same hour.
package demo

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/fleettest"
)

// Options configures Load.
type Options struct {
	// Server is the base URL of a DeepSeed server, e.g. http://localhost:8080.
	Server string
	// Token is sent as a bearer token when not empty.
	Token string
	// BatchSize bounds the records of one POST; 0 means 5000.
	BatchSize int
	// Progress receives a line per run; nil discards it. With Redraw the
	// line is redrawn (a carriage return) after each batch, for a
	// terminal; without, it is written once the run is loaded, so that a
	// log (docker compose logs, CI) reads a line per run.
	Progress io.Writer
	Redraw   bool
	// Client sends the requests; nil means a client with a 60 s timeout.
	Client *http.Client
	// MaxRetries bounds the retries of one batch answered 503 or not
	// answered at all; 0 means 8.
	MaxRetries int
	// Anchor is where the simulated timeline ends; zero means now.
	Anchor time.Time
	// Force writes runs the server already holds as finished.
	Force bool
}

// Result sums up what the server said of a load.
type Result struct {
	Runs       int
	Records    int
	Accepted   int
	Duplicates int
	// Skipped counts runs already on the server, finished, and not
	// written again.
	Skipped int
}

// Load posts every simulated run to the server's ingest API, run by run,
// in gzip NDJSON batches, retrying a batch answered 503 after the server's
// Retry-After.
func Load(ctx context.Context, opt Options) (Result, error) {
	if opt.Server == "" {
		return Result{}, errors.New("no server URL")
	}
	if opt.BatchSize <= 0 {
		opt.BatchSize = 5000
	}
	if opt.MaxRetries <= 0 {
		opt.MaxRetries = 8
	}
	if opt.Client == nil {
		opt.Client = &http.Client{Timeout: 60 * time.Second}
	}
	if opt.Progress == nil {
		opt.Progress = io.Discard
	}
	url := strings.TrimRight(opt.Server, "/") + "/api/v1/ingest"
	var res Result
	if opt.Anchor.IsZero() {
		opt.Anchor = time.Now()
	}
	runs := fleettest.DemoRuns(opt.Anchor)
	for i, r := range runs {
		if !opt.Force && finishedOnServer(ctx, opt, r.ID) {
			fmt.Fprintf(opt.Progress, "demo: run %d/%d %-44s already loaded\n", i+1, len(runs), r.ID)
			res.Runs++
			res.Skipped++
			continue
		}
		recs := r.Records()
		for start := 0; start < len(recs); start += opt.BatchSize {
			end := min(start+opt.BatchSize, len(recs))
			ir, err := post(ctx, opt, url, recs[start:end])
			if err != nil {
				if start > 0 && opt.Redraw {
					fmt.Fprintln(opt.Progress) // end the progress line
				}
				return res, fmt.Errorf("run %s: %w", r.ID, err)
			}
			res.Accepted += ir.Accepted
			res.Duplicates += ir.Duplicates
			res.Records += end - start
			if opt.Redraw {
				fmt.Fprintf(opt.Progress, "\rdemo: run %d/%d %-44s %6d/%d records", i+1, len(runs), r.ID, end, len(recs))
			}
		}
		if opt.Redraw {
			fmt.Fprintln(opt.Progress)
		} else {
			fmt.Fprintf(opt.Progress, "demo: run %d/%d %-44s %6d records\n", i+1, len(runs), r.ID, len(recs))
		}
		res.Runs++
	}
	fmt.Fprintf(opt.Progress, "demo: %d runs (%d already loaded), %d records: %d accepted, %d already there\n",
		res.Runs, res.Skipped, res.Records, res.Accepted, res.Duplicates)
	return res, nil
}

// finishedOnServer reports whether the server holds run id with a final
// status. Any failure to tell means no: the run is written, and ingest
// deduplicates.
func finishedOnServer(ctx context.Context, opt Options, id string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(opt.Server, "/")+"/api/v1/runs/"+id, nil)
	if err != nil {
		return false
	}
	if opt.Token != "" {
		req.Header.Set("Authorization", "Bearer "+opt.Token)
	}
	res, err := opt.Client.Do(req)
	if err != nil {
		return false
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, res.Body)
		return false
	}
	var r api.RunSummary
	if err := json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&r); err != nil {
		return false
	}
	return r.Status != "" && r.Status != api.StatusRunning
}

func post(ctx context.Context, opt Options, url string, recs []any) (api.IngestResult, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	enc := json.NewEncoder(zw)
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			return api.IngestResult{}, fmt.Errorf("encode record: %w", err)
		}
	}
	if err := zw.Close(); err != nil {
		return api.IngestResult{}, fmt.Errorf("compress batch: %w", err)
	}
	body := buf.Bytes()
	wait := time.Second
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return api.IngestResult{}, err
		}
		req.Header.Set("Content-Type", "application/x-ndjson")
		req.Header.Set("Content-Encoding", "gzip")
		if opt.Token != "" {
			req.Header.Set("Authorization", "Bearer "+opt.Token)
		}
		resp, err := opt.Client.Do(req)
		retry := err != nil
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusCreated || resp.StatusCode == http.StatusAccepted:
				var ir api.IngestResult
				if err := json.Unmarshal(b, &ir); err != nil {
					return api.IngestResult{}, fmt.Errorf("read ingest answer: %w", err)
				}
				return ir, nil
			case resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests:
				retry = true
				if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
					wait = time.Duration(s) * time.Second
				}
				err = answerError(resp.StatusCode, b)
			default:
				return api.IngestResult{}, answerError(resp.StatusCode, b)
			}
		}
		if !retry || attempt >= opt.MaxRetries {
			return api.IngestResult{}, fmt.Errorf("post batch: %w", err)
		}
		fmt.Fprintf(opt.Progress, "\ndemo: %v; retrying in %v\n", err, wait)
		select {
		case <-ctx.Done():
			return api.IngestResult{}, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(wait*2, 30*time.Second)
	}
}

// AnswerError is a refusal in the server's words: the message of its JSON
// error body, or the body itself when it is not one, on one line.
type AnswerError struct {
	Status int
	Msg    string
}

func (e *AnswerError) Error() string {
	if e.Msg == "" {
		return fmt.Sprintf("server answered %d %s", e.Status, http.StatusText(e.Status))
	}
	return fmt.Sprintf("server answered %d %s: %s", e.Status, http.StatusText(e.Status), e.Msg)
}

func answerError(status int, body []byte) error {
	var e api.Error
	msg := strings.TrimSpace(string(body))
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		msg = e.Error
	}
	msg = strings.Join(strings.Fields(msg), " ")
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	return &AnswerError{Status: status, Msg: msg}
}
