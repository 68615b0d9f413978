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
	"time"

	"github.com/deepseed/deepseed/api"
)

// ImportCommand posts a training_metrics.json export to POST /api/v1/import.
type ImportCommand struct{}

const importNotes = `
Each FILE (- for standard input; gzip files are read as they are) is either
the seed dashboard's export or NDJSON. NDJSON is what the hook writes when
it cannot send (deepseed-runs/<run_id>.ndjson, one record a line; also in
offline mode) or the collector's dead-letter file (one
refused batch a line, whose records are sent again); its records go to
POST /api/v1/ingest in batches of up to 2,000 records, with progress on
standard error. The server stores a record it already has once, so a file
may be sent again after an interruption. A record the server refuses stops
the file with its line number; the batches before it are stored.

The export is the seed dashboard's training_metrics.json (meta, steps,
evaluations, zero_memory). It becomes one finished run with its steps,
per-layer times, evaluations and ZeRO memory breakdown. Without --run-id the
run id is derived from the file's contents, so importing the same file twice
stores nothing twice. Importing it again with another --project is refused,
since that would move the run: without --project it stays where it is, and
--run-id stores a second run. The run id is printed on success.`

// Run implements command.
func (c *ImportCommand) Run(ctx context.Context, args []string) error {
	f := newEnvFlags("import")
	server := addServerFlag(f)
	tok := addTokenFlag(f, ingestToken)
	project := f.String("project", "DEEPSEED_PROJECT", "", "project of the run (default: default)")
	name := f.String("name", "", "", "name of the run (default: the export's model)")
	runID := f.String("run-id", "", "", "run id (default: derived from the file's contents)")
	timeout := f.String("timeout", "", "2m", "how long to keep trying, retries included")
	f.setUsage("deepseed import [flags] FILE...", "Import a training_metrics.json export, or send NDJSON records (the hook's offline file, the collector's dead-letter file).", importNotes)
	if err := f.parse(args); err != nil {
		return err
	}
	files := f.fs.Args()
	if len(files) == 0 {
		f.fs.Usage()
		return errors.New("import: give the file(s) to import")
	}
	wait, err := time.ParseDuration(*timeout)
	if err != nil || wait <= 0 {
		return fmt.Errorf("import: --timeout %q: want a duration such as 2m", *timeout)
	}
	base, err := serverURL(*server)
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	token, err := tok.value()
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	for _, file := range files {
		body, err := readInput(file)
		if err != nil {
			return fmt.Errorf("import: %w", err)
		}
		export, err := isExport(file, body)
		if err != nil {
			return fmt.Errorf("import: %w", err)
		}
		fctx, cancel := context.WithTimeout(ctx, wait)
		if export {
			err = importExport(fctx, base, token, file, body, *runID, *project, *name)
		} else {
			err = sendRecords(fctx, base.JoinPath("/api/v1/ingest").String(), token, file, body)
		}
		timedOut := ctx.Err() == nil && errors.Is(fctx.Err(), context.DeadlineExceeded)
		cancel()
		if err != nil && timedOut {
			return fmt.Errorf("import: %s: timed out after %v waiting for the server at %s (raise --timeout; sending the file again is safe, what is stored is not stored twice)",
				file, wait, base)
		}
		var ref *refusal
		if errors.As(err, &ref) {
			if e := tok.refused(base.String(), ref.status, token != "", ref.body.Error); e != nil {
				return fmt.Errorf("import: %s: %w", file, e)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// readInput reads a file, or standard input for "-", gunzipping it when
// it is gzip.
func readInput(file string) ([]byte, error) {
	var body []byte
	var err error
	if file == "-" {
		body, err = io.ReadAll(os.Stdin)
	} else {
		body, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, err
	}
	if bytes.HasPrefix(body, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, fmt.Errorf("%s: not readable gzip: %w", file, err)
		}
		if body, err = io.ReadAll(zr); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, fmt.Errorf("%s: the gzip data ends early: the file is truncated (copy or write it again)", file)
			}
			return nil, fmt.Errorf("%s: not readable gzip: %w", file, err)
		}
	}
	return body, nil
}

// isExport tells the seed's training_metrics.json (one JSON object with
// steps, evaluations or zero_memory) from NDJSON records. It reads NaN
// and Infinity as the server does. An export cut short is not an export
// and not NDJSON: that is said as such.
func isExport(file string, body []byte) (bool, error) {
	var head map[string]json.RawMessage
	err := json.Unmarshal(api.NormalizeJSON(body), &head)
	if err != nil {
		t := bytes.TrimSpace(body)
		firstLine, _, _ := bytes.Cut(t, []byte("\n"))
		// An object over several lines is no NDJSON: say what is wrong
		// with it as a whole rather than with its first line.
		if len(t) > 0 && t[0] == '{' && !json.Valid(api.NormalizeJSON(firstLine)) {
			return false, fmt.Errorf("%s: not valid JSON: %s", file, jsonProblem(err))
		}
		return false, nil
	}
	_, kind := head["kind"]
	_, steps := head["steps"]
	_, evals := head["evaluations"]
	_, zero := head["zero_memory"]
	return !kind && (steps || evals || zero), nil
}

// importExport posts a training_metrics.json export to /api/v1/import.
func importExport(ctx context.Context, base *url.URL, token, file string, body []byte, runID, project, name string) error {
	var zbuf bytes.Buffer
	zw := gzip.NewWriter(&zbuf)
	_, _ = zw.Write(body)
	if err := zw.Close(); err != nil {
		return fmt.Errorf("import: compress: %w", err)
	}
	q := url.Values{}
	for k, v := range map[string]string{"run_id": runID, "project": project, "name": name} {
		if v != "" {
			q.Set(k, v)
		}
	}
	target := base.JoinPath("/api/v1/import")
	target.RawQuery = q.Encode()
	res, err := postWithRetry(ctx, target.String(), token, zbuf.Bytes())
	if err != nil {
		return fmt.Errorf("import %s: %w", file, err)
	}
	fmt.Fprintf(os.Stderr, "imported %s: %d records stored, %d already there\n", file, res.Accepted, res.Duplicates)
	for _, id := range res.RunIDs {
		fmt.Println(id)
	}
	return nil
}

// refusal is an answer other than 200 or 503.
type refusal struct {
	status int
	body   api.Error
}

func (r *refusal) Error() string {
	return fmt.Sprintf("server answered %d: %s", r.status, r.body.Error)
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
			if ctx.Err() != nil {
				return api.IngestResult{}, fmt.Errorf("server unreachable: %s: %w", netReason(err), ctx.Err())
			}
			fmt.Fprintf(os.Stderr, "server unreachable: %s; retrying in 2s\n", netReason(err))
			select {
			case <-ctx.Done():
				return api.IngestResult{}, fmt.Errorf("server unreachable: %s: %w", netReason(err), ctx.Err())
			case <-time.After(2 * time.Second):
			}
			continue
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
			if json.Unmarshal(b, &e) != nil || e.Error == "" {
				e = api.Error{Error: string(bytes.TrimSpace(b))}
			}
			return api.IngestResult{}, &refusal{status: resp.StatusCode, body: e}
		}
	}
}
