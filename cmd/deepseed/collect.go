package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/deepseed/deepseed/collector"
	"github.com/deepseed/deepseed/collector/nvml"
)

// CollectCommand runs the node collector.
type CollectCommand struct{}

// Run implements command.
func (c *CollectCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("deepseed collect", flag.ContinueOnError)
	var (
		server        = fs.String("server", envStr("DEEPSEED_SERVER_URL", ""), "DeepSeed server base URL to forward to; empty: sample and serve /metrics only (env DEEPSEED_SERVER_URL)")
		tokenFile     = fs.String("token-file", envStr("DEEPSEED_TOKEN_FILE", ""), "file holding the ingest token sent as Authorization: Bearer; or set DEEPSEED_TOKEN (env DEEPSEED_TOKEN_FILE)")
		hookListen    = fs.String("hook-listen", envStr("DEEPSEED_HOOK_LISTEN", "127.0.0.1:9464"), "hook receiver address, host:port or unix:/path (env DEEPSEED_HOOK_LISTEN)")
		metricsListen = fs.String("metrics-listen", envStr("DEEPSEED_METRICS_LISTEN", "127.0.0.1:9400"), "address for /metrics; 0.0.0.0:9400 for scrapers on other machines; empty disables it (env DEEPSEED_METRICS_LISTEN)")
		interval      = fs.Duration("interval", envDur("DEEPSEED_INTERVAL", time.Second), "GPU and host sampling interval (env DEEPSEED_INTERVAL)")
		fastInterval  = fs.Duration("fast-interval", envDur("DEEPSEED_FAST_INTERVAL", collector.DefaultFastInterval), "sampling interval of GPUs that a training process announced by the hook holds; 0 samples them at -interval like the others (env DEEPSEED_FAST_INTERVAL)")
		counterIval   = fs.Duration("counter-interval", envDur("DEEPSEED_COUNTER_INTERVAL", collector.DefaultCounterInterval), "how often the costly GPU counters are read: energy, PCIe, NVLink, ECC, remapped rows (env DEEPSEED_COUNTER_INTERVAL)")
		spoolDir      = fs.String("spool-dir", envStr("DEEPSEED_SPOOL_DIR", "/var/lib/deepseed/spool"), "directory for batches waiting for the server, and the dead-letter file (env DEEPSEED_SPOOL_DIR)")
		spoolMax      = fs.Int64("spool-max-bytes", envInt("DEEPSEED_SPOOL_MAX_BYTES", 1<<30), "spool size bound; when full the hook is answered 503 and keeps its records, and the oldest sampled records are dropped and counted (env DEEPSEED_SPOOL_MAX_BYTES)")
		hostName      = fs.String("host-name", envStr("DEEPSEED_HOST_NAME", ""), "host name on records and metrics; default the system's (env DEEPSEED_HOST_NAME)")
		dcgm          = fs.Bool("dcgm-compat", envBool("DEEPSEED_DCGM_COMPAT", true), "also export dcgm-exporter metric names and labels (env DEEPSEED_DCGM_COMPAT)")
		batchMax      = fs.Int("batch-max-records", int(envInt("DEEPSEED_BATCH_MAX_RECORDS", 5000)), "records per batch sent to the server (env DEEPSEED_BATCH_MAX_RECORDS)")
		batchAge      = fs.Duration("batch-max-age", envDur("DEEPSEED_BATCH_MAX_AGE", time.Second), "longest a record waits before its batch is sent (env DEEPSEED_BATCH_MAX_AGE)")
		nvmlLib       = fs.String("nvml-lib", envStr("DEEPSEED_NVML_LIB", ""), "path of libnvidia-ml; default the system's libnvidia-ml.so.1 (env DEEPSEED_NVML_LIB)")
		procRoot      = fs.String("proc", envStr("DEEPSEED_PROC", "/proc"), "the host's /proc, e.g. /host/proc in a container (env DEEPSEED_PROC)")
		capture       = fs.String("capture", envStr("DEEPSEED_CAPTURE", ""), "write every NVML reading to this file in the test-fixture format (env DEEPSEED_CAPTURE)")
		noGPU         = fs.Bool("no-gpu", envBool("DEEPSEED_NO_GPU", false), "do not sample GPUs (env DEEPSEED_NO_GPU)")
		fakeGPU       = fs.String("fake-nvml", envStr("DEEPSEED_FAKE_NVML", ""), "replay this NVML capture instead of reading GPUs, for load tests (env DEEPSEED_FAKE_NVML)")
		fakeGPUs      = fs.Int("fake-gpus", int(envInt("DEEPSEED_FAKE_GPUS", 0)), "with -fake-nvml, show this many GPUs (env DEEPSEED_FAKE_GPUS)")
		logLevel      = fs.String("log-level", envStr("DEEPSEED_LOG_LEVEL", "info"), "debug, info, warn or error (env DEEPSEED_LOG_LEVEL)")
	)
	fs.Func("token", "not taken: a token on the command line is visible to every user in ps; set DEEPSEED_TOKEN or use -token-file", func(string) error {
		return errors.New("a token on the command line is visible to every user of the machine (ps): set DEEPSEED_TOKEN or use --token-file")
	})
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: deepseed collect [flags]

Runs the node collector: samples every GPU through NVML and the host through
/proc, receives the training hook's records on -hook-listen (POST
/api/v1/ingest, as the server takes them), forwards everything to -server in
batches, spools to -spool-dir while the server is away, and serves /metrics.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("collect: unexpected arguments %q", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("collect: log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	// The collector shares its node with training: its work needs a
	// fraction of one core, and on a node with a hundred cores a Go
	// scheduler and collector spread over all of them would keep waking
	// idle threads to look for that little work. One P keeps it on one
	// core; GOMAXPROCS in the environment still decides when set.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	if addr := os.Getenv("DEEPSEED_PPROF_LISTEN"); addr != "" {
		if err := servePprof(ctx, addr, log); err != nil {
			return fmt.Errorf("collect: DEEPSEED_PPROF_LISTEN: %w", err)
		}
	}

	token := os.Getenv("DEEPSEED_TOKEN")
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("collect: token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return fmt.Errorf("collect: token-file: %s is empty", *tokenFile)
		}
	}

	var lib nvml.Iface
	switch {
	case *noGPU:
	case *fakeGPU != "":
		cp, err := nvml.LoadCapture(*fakeGPU)
		if err != nil {
			return fmt.Errorf("collect: fake-nvml: %w", err)
		}
		lib = nvml.NewFake(cp, *fakeGPUs)
	default:
		lib = &nvml.Real{LibPath: *nvmlLib}
	}
	if *capture != "" && lib != nil {
		lib = &nvml.Recorder{Inner: lib, Path: *capture, Source: "deepseed collect " + Version}
	}
	if *fastInterval == 0 {
		*fastInterval = -1 // off
	}
	col, err := collector.New(collector.Config{
		Server: *server, Token: token, HookListen: *hookListen, MetricsListen: *metricsListen,
		Interval: *interval, FastInterval: *fastInterval, CounterInterval: *counterIval, SpoolDir: *spoolDir, SpoolMaxBytes: *spoolMax, HostName: *hostName,
		DCGMCompat: *dcgm, BatchMaxRecords: *batchMax, BatchMaxAge: *batchAge, ProcRoot: *procRoot,
		NVML: lib, Logger: log,
	})
	if err != nil {
		return fmt.Errorf("collect: %w", err)
	}
	return col.Run(ctx)
}

// servePprof serves the Go profiler on addr until ctx is done. It is set
// only through the environment, not a flag: it is for measuring the
// collector or the server under load, not for production.
func servePprof(ctx context.Context, addr string, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	go func() { <-ctx.Done(); srv.Close() }()
	log.Info("profiler listening", "addr", ln.Addr().String())
	return nil
}

func envStr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok {
		return v
	}
	return def
}

// The env helpers keep the default when a variable does not parse; the
// flag's own parsing then reports a bad value given on the command line.
func envInt(key string, def int64) int64 {
	if v, err := strconv.ParseInt(os.Getenv(key), 10, 64); err == nil {
		return v
	}
	return def
}

func envDur(key string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(key)); err == nil {
		return v
	}
	return def
}

func envBool(key string, def bool) bool {
	if v, err := strconv.ParseBool(os.Getenv(key)); err == nil {
		return v
	}
	return def
}
