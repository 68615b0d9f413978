package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/deepseed/deepseed/api"
)

// ImportCommand posts a training_metrics.json export to POST /api/v1/import.
type ImportCommand struct{}

const importNotes = `
The export is the seed dashboard's training_metrics.json (meta, steps,
evaluations, zero_memory). It becomes one finished run with its steps,
per-layer times, evaluations and ZeRO memory breakdown. Without --run-id the
run id is derived from the file's contents, so importing the same file twice
stores nothing twice. The run id is printed on success.`

// Run implements command.
func (c *ImportCommand) Run(ctx context.Context, args []string) error {
	f := newEnvFlags("import")
	server := f.String("server", "DEEPSEED_SERVER_URL", "http://localhost:8080", "DeepSeed server base URL")
	token := f.String("token", "DEEPSEED_TOKEN", "", "ingest token, sent as Authorization: Bearer")
	project := f.String("project", "DEEPSEED_PROJECT", "", "project of the run (default: default)")
	name := f.String("name", "", "", "name of the run (default: the export's model)")
	runID := f.String("run-id", "", "", "run id (default: derived from the file's contents)")
	timeout := f.String("timeout", "", "2m", "how long to keep trying, retries included")
	f.setUsage("deepseed import [flags] FILE", "Import a training_metrics.json export as a run.", importNotes)
	if err := f.fs.Parse(args); err != nil {
		return err
	}
	// Accept flags after the file name too: deepseed import FILE --server URL.
	rest := f.fs.Args()
	if len(rest) == 0 {
		f.fs.Usage()
		return errors.New("import: give the export file")
	}
	file := rest[0]
	if err := f.fs.Parse(rest[1:]); err != nil {
		return err
	}
	if f.fs.NArg() > 0 {
		return fmt.Errorf("import: one file at a time, got also %q", f.fs.Arg(0))
	}
	wait, err := time.ParseDuration(*timeout)
	if err != nil || wait <= 0 {
		return fmt.Errorf("import: --timeout %q: want a duration such as 2m", *timeout)
	}
	base, err := url.Parse(strings.TrimRight(*server, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return fmt.Errorf("import: --server %q: want an http(s) URL", *server)
	}

	body, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	var zbuf bytes.Buffer
	zw := gzip.NewWriter(&zbuf)
	_, _ = zw.Write(body)
	if err := zw.Close(); err != nil {
		return fmt.Errorf("import: compress: %w", err)
	}
	q := url.Values{}
	for k, v := range map[string]string{"run_id": *runID, "project": *project, "name": *name} {
		if v != "" {
			q.Set(k, v)
		}
	}
	target := base.JoinPath("/api/v1/import")
	target.RawQuery = q.Encode()

	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	res, err := postWithRetry(ctx, target.String(), *token, zbuf.Bytes())
	if err != nil {
		return fmt.Errorf("import %s: %w", file, err)
	}
	fmt.Fprintf(os.Stderr, "imported %s: %d records stored, %d already there\n", file, res.Accepted, res.Duplicates)
	for _, id := range res.RunIDs {
		fmt.Println(id)
	}
	return nil
}

// postWithRetry posts a gzip body and decodes the IngestResult, waiting
// out 503 answers as the server's Retry-After asks.
func postWithRetry(ctx context.Context, target, token string, gz []byte) (api.IngestResult, error) {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(gz))
		if err != nil {
			return api.IngestResult{}, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", "gzip")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return api.IngestResult{}, err
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			var res api.IngestResult
			if err := json.Unmarshal(b, &res); err != nil {
				return res, fmt.Errorf("server answered 200 with %q: %w", b, err)
			}
			return res, nil
		case http.StatusServiceUnavailable:
			delay := 5 * time.Second
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
				delay = time.Duration(s) * time.Second
			}
			fmt.Fprintf(os.Stderr, "server unavailable, retrying in %v\n", delay)
			select {
			case <-ctx.Done():
				return api.IngestResult{}, fmt.Errorf("server still unavailable: %w", ctx.Err())
			case <-time.After(delay):
			}
		default:
			var e api.Error
			if json.Unmarshal(b, &e) == nil && e.Error != "" {
				return api.IngestResult{}, fmt.Errorf("server answered %d: %s", resp.StatusCode, e.Error)
			}
			return api.IngestResult{}, fmt.Errorf("server answered %d: %s", resp.StatusCode, bytes.TrimSpace(b))
		}
	}
}
