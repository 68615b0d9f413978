// Package demo writes realistic simulated training runs through the
// public ingest API, so that a fresh DeepSeed shows every chart and
// reproduces the comparison tables of the experiment report.
//
// Usage:
//  1. runs := demo.Runs() — every simulated run, deterministic.
//  2. err := demo.Load(ctx, demo.Options{Server: url, Token: t, Progress: os.Stderr})
//
// Run ids and timestamps are fixed, so loading twice stores nothing new:
// ingest recognises every record as a duplicate.
package demo

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/deepseed/deepseed/api"
)

// Options configures Load.
type Options struct {
	// Server is the base URL of a DeepSeed server, e.g. http://localhost:8080.
	Server string
	// Token is sent as a bearer token when not empty.
	Token string
	// BatchSize bounds the records of one POST; 0 means 5000.
	BatchSize int
	// Progress receives one line per run and batch; nil discards it.
	Progress io.Writer
	// Client sends the requests; nil means a client with a 60 s timeout.
	Client *http.Client
	// MaxRetries bounds the retries of one batch answered 503 or not
	// answered at all; 0 means 8.
	MaxRetries int
}

// Result sums up what the server said of a load.
type Result struct {
	Runs       int
	Records    int
	Accepted   int
	Duplicates int
}

// Load posts every simulated run to the server's ingest API, run by run,
// in gzip NDJSON batches, retrying a batch answered 503 after the server's
// Retry-After.
func Load(ctx context.Context, opt Options) (Result, error) {
	if opt.Server == "" {
		return Result{}, fmt.Errorf("demo: no server URL")
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
	runs := Runs()
	for i, r := range runs {
		recs := r.Records()
		for start := 0; start < len(recs); start += opt.BatchSize {
			end := min(start+opt.BatchSize, len(recs))
			ir, err := post(ctx, opt, url, recs[start:end])
			if err != nil {
				return res, fmt.Errorf("demo: run %s: %w", r.ID, err)
			}
			res.Accepted += ir.Accepted
			res.Duplicates += ir.Duplicates
			res.Records += end - start
			fmt.Fprintf(opt.Progress, "\rdemo: run %d/%d %-44s %6d/%d records", i+1, len(runs), r.ID, end, len(recs))
		}
		fmt.Fprintln(opt.Progress)
		res.Runs++
	}
	fmt.Fprintf(opt.Progress, "demo: %d runs, %d records: %d accepted, %d already there\n",
		res.Runs, res.Records, res.Accepted, res.Duplicates)
	return res, nil
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
				err = fmt.Errorf("server answered %d: %s", resp.StatusCode, bytes.TrimSpace(b))
			default:
				return api.IngestResult{}, fmt.Errorf("server answered %d: %s", resp.StatusCode, bytes.TrimSpace(b))
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
