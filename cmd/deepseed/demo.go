package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/deepseed/deepseed/demo"
)

// DemoCommand writes the simulated demo runs through the ingest API.
type DemoCommand struct{}

// envOr returns $env when set, else def.
func envOr(env, def string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}

// Run implements command.
func (c *DemoCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("deepseed demo", flag.ContinueOnError)
	server := fs.String("server", envOr("DEEPSEED_SERVER_URL", "http://localhost:8080"), "DeepSeed server base URL (env DEEPSEED_SERVER_URL)")
	token := fs.String("token", envOr("DEEPSEED_TOKEN", ""), "ingest token, sent as Authorization: Bearer (env DEEPSEED_TOKEN)")
	batch := fs.Int("batch", 5000, "records per request")
	force := fs.Bool("force", false, "write runs again even when the server already holds them as finished")
	timeout := fs.Duration("timeout", 10*time.Minute, "how long the whole load may take, retries included")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprint(w, `Usage: deepseed demo [flags]

Write simulated training runs through the ingest API: a BERT-large ZeRO-2
fp16 CPU-offload run shaped like the original dashboard's, and the pythia
runs whose /compare?sweep=… reproduces the experiment report's tables
(sweeps pythia-zero-stages, pythia-precision, pythia-parallelism,
pythia-offload, pythia-410m). Every run is tagged "simulated", lives in the
project "demo", and has a fixed id. The simulated timeline ends at the
time of the load, so Grafana's recent time ranges show it; running the
command again skips the runs already loaded (use --force to write them
again).

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("demo: unexpected argument %q", fs.Arg(0))
	}
	u, err := url.Parse(strings.TrimRight(*server, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("demo: --server %q: want an http(s) URL", *server)
	}
	if *batch < 1 || *batch > 100000 {
		return fmt.Errorf("demo: --batch %d: want 1 to 100000", *batch)
	}
	if *timeout <= 0 {
		return fmt.Errorf("demo: --timeout %v: want a positive duration", *timeout)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	_, err = demo.Load(ctx, demo.Options{Server: u.String(), Token: *token, BatchSize: *batch, Progress: os.Stderr, Force: *force})
	return err
}
