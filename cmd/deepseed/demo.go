package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/deepseed/deepseed/demo"
	"github.com/deepseed/deepseed/internal/fleettest"
)

// DemoCommand writes the simulated demo runs through the ingest API.
type DemoCommand struct{}

// Run implements command.
func (c *DemoCommand) Run(ctx context.Context, args []string) error {
	f := newEnvFlags("demo")
	server := addServerFlag(f)
	tok := addTokenFlag(f, ingestToken)
	batch := f.String("batch", "", "5000", "records per request")
	force := f.Bool("force", "", false, "write runs again even when the server already holds them as finished")
	timeout := f.String("timeout", "", "10m", "how long the whole load may take, retries included")
	f.setUsage("deepseed demo [flags]", `
Write simulated training runs through the ingest API: a BERT-large ZeRO-2
fp16 CPU-offload run shaped like the original dashboard's, and the pythia
runs whose /compare?sweep=… reproduces the experiment report's tables
(sweeps pythia-zero-stages, pythia-precision, pythia-parallelism,
pythia-offload, pythia-410m). Every run is tagged "simulated", lives in the
project "demo", and has a fixed id. The simulated timeline ends at the
time of the load, so Grafana's recent time ranges show it; running the
command again skips the runs already loaded (use --force to write them
again). Progress goes to standard error, a line per run.`, "")
	if err := f.parse(args); err != nil {
		return err
	}
	if f.fs.NArg() > 0 {
		return fmt.Errorf("demo: unexpected argument %q (see deepseed demo -h)", f.fs.Arg(0))
	}
	u, err := serverURL(*server)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	token, err := tok.value()
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	n, err := strconv.Atoi(*batch)
	if err != nil || n < 1 || n > 100000 {
		return fmt.Errorf("demo: --batch %q: want 1 to 100000", *batch)
	}
	wait, err := time.ParseDuration(*timeout)
	if err != nil || wait <= 0 {
		return fmt.Errorf("demo: --timeout %q: want a positive duration such as 10m", *timeout)
	}
	lctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	res, err := demo.Load(lctx, demo.Options{Server: u.String(), Token: token, BatchSize: n, Progress: os.Stderr, Redraw: isTerminal(os.Stderr), Force: *force})
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("demo: interrupted after %d of %d runs; running it again skips the runs already loaded", res.Runs, len(fleettest.DemoRuns(time.Now())))
	case errors.Is(lctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("demo: timed out after %v waiting for the server at %s (%d of %d runs loaded; see the lines above, or raise --timeout)",
			wait, u, res.Runs, len(fleettest.DemoRuns(time.Now())))
	}
	var ae *demo.AnswerError
	if errors.As(err, &ae) {
		if e := tok.refused(u.String(), ae.Status, token != "", ae.Msg); e != nil {
			return fmt.Errorf("demo: %w", e)
		}
	}
	return fmt.Errorf("demo: %w", err)
}

// isTerminal reports whether f is a terminal, where a progress line may be
// redrawn in place.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
