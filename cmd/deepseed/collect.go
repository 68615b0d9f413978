package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/deepseed/deepseed/collector"
	"github.com/deepseed/deepseed/collector/nvml"
	"github.com/deepseed/deepseed/internal/httplimit"
	"github.com/deepseed/deepseed/server"
)

// CollectCommand runs the node collector.
type CollectCommand struct{}

// Run implements command.
func (c *CollectCommand) Run(ctx context.Context, args []string) error {
	f := newEnvFlags("collect")
	var (
		serverURL     = f.String("server", "DEEPSEED_SERVER_URL", "", "DeepSeed server base URL to forward to; empty: sample and serve /metrics only")
		tokenFile     = addTokenFlag(f, ingestToken)
		hookListen    = f.String("hook-listen", "DEEPSEED_HOOK_LISTEN", "127.0.0.1:9464", "hook receiver address, host:port or unix:/path")
		metricsListen = f.String("metrics-listen", "DEEPSEED_METRICS_LISTEN", "127.0.0.1:9400", "address for /metrics; 0.0.0.0:9400 for scrapers on other machines; empty disables it")
		interval      = f.String("interval", "DEEPSEED_INTERVAL", "1s", "GPU and host sampling interval")
		fastInterval  = f.String("fast-interval", "DEEPSEED_FAST_INTERVAL", collector.DefaultFastInterval.String(), "sampling interval of GPUs that a training process announced by the hook holds; 0 samples them at --interval like the others")
		counterIval   = f.String("counter-interval", "DEEPSEED_COUNTER_INTERVAL", collector.DefaultCounterInterval.String(), "how often the costly GPU counters are read: PCIe, NVLink, ECC, remapped rows")
		energyIval    = f.String("energy-interval", "DEEPSEED_ENERGY_INTERVAL", collector.DefaultEnergyInterval.String(), "how often the GPU energy counter is read (milliseconds of CPU a read); between reads the sampled power is added up")
		gpmIval       = f.String("gpm-interval", "DEEPSEED_GPM_INTERVAL", collector.DefaultGPMInterval.String(), "how often GPM metrics (SM, tensor and DRAM activity) are read on GPUs a training process holds; others read them every --counter-interval")
		procIval      = f.String("process-interval", "DEEPSEED_PROCESS_INTERVAL", collector.DefaultProcessInterval.String(), "how often each GPU's process list is read; a training process announced by the hook or exiting has it read at once")
		spoolDir      = f.String("spool-dir", "DEEPSEED_SPOOL_DIR", defaultSpoolDir(), "directory for batches waiting for the server, and the dead-letter file")
		spoolMax      = f.String("spool-max-bytes", "DEEPSEED_SPOOL_MAX_BYTES", "1073741824", "spool size bound; when full the oldest sampled records are dropped and counted, then the hook is answered 503 and keeps its records; acknowledged hook records are never dropped")
		hostName      = f.String("host-name", "DEEPSEED_HOST_NAME", "", "host name on records and metrics; default the system's")
		dcgm          = f.Bool("dcgm-compat", "DEEPSEED_DCGM_COMPAT", true, "also export dcgm-exporter metric names and labels")
		batchMax      = f.String("batch-max-records", "DEEPSEED_BATCH_MAX_RECORDS", "5000", "most records in one send to the server (the oldest spooled batches go together)")
		batchBytes    = f.String("batch-max-bytes", "DEEPSEED_BATCH_MAX_BYTES", strconv.Itoa(collector.DefaultBatchMaxBytes), "most bytes (uncompressed) in one send to the server; keep it within the server's --max-body-bytes")
		batchAge      = f.String("batch-max-age", "DEEPSEED_BATCH_MAX_AGE", "1s", "longest a record waits before its batch is sent")
		nvmlLib       = f.String("nvml-lib", "DEEPSEED_NVML_LIB", "", "path of libnvidia-ml; default the system's libnvidia-ml.so.1")
		procRoot      = f.String("proc", "DEEPSEED_PROC", "/proc", "the host's /proc, e.g. /host/proc in a container")
		capture       = f.String("capture", "DEEPSEED_CAPTURE", "", "write every NVML reading to this file in the test-fixture format")
		noGPU         = f.Bool("no-gpu", "DEEPSEED_NO_GPU", false, "do not sample GPUs")
		fakeGPU       = f.String("fake-nvml", "DEEPSEED_FAKE_NVML", "", "replay this NVML capture instead of reading GPUs, for load tests")
		fakeGPUs      = f.String("fake-nvml-gpus", "DEEPSEED_FAKE_NVML_GPUS", "0", "with --fake-nvml, show this many GPUs")
		logLevel      = f.String("log-level", "DEEPSEED_LOG_LEVEL", "info", "log level: debug, info, warn or error")
		httpf         = addHTTPFlags(f, "hook")
	)
	f.setUsage("deepseed collect [flags]", `
Run the node collector: sample every GPU through NVML and the host through
/proc, receive the training hook's records on --hook-listen (POST
/api/v1/ingest, as the server takes them), forward everything to --server
in batches, spool to --spool-dir while the server is away, and serve
/metrics.`, `
The spool directory defaults to $XDG_STATE_HOME/deepseed/spool, else
~/.local/state/deepseed/spool, so that any user can run the collector; as
root it is /var/lib/deepseed/spool. The collector logs the directory it uses
at start.

The hook receiver needs no token: keep it on loopback or a unix socket.
What a client can make it hold is bounded by --max-body-bytes,
--read-header-timeout, --body-timeout and --max-conns (each listener), as on
the server (see docs/durability.md).

`+pprofNote)
	if err := f.parse(args); err != nil {
		return err
	}
	if f.fs.NArg() > 0 {
		return fmt.Errorf("collect: unexpected arguments %q (see deepseed collect -h)", f.fs.Args())
	}
	var errs []error
	dur := func(name, v string) time.Duration {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, &server.FieldError{Field: name, Value: v, Msg: "want a positive duration such as 1s"})
		}
		return d
	}
	num := func(name, v string, min int64) int64 {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < min {
			errs = append(errs, &server.FieldError{Field: name, Value: v, Msg: fmt.Sprintf("want a whole number of at least %d", min)})
		}
		return n
	}
	every, maxAge := dur("interval", *interval), dur("batch-max-age", *batchAge)
	counters := dur("counter-interval", *counterIval)
	energyEvery, gpmEvery, procEvery := dur("energy-interval", *energyIval), dur("gpm-interval", *gpmIval), dur("process-interval", *procIval)
	// The fast interval may be 0: held GPUs are then sampled like the
	// others (the collector takes a negative interval as off).
	fast, err := time.ParseDuration(*fastInterval)
	if err != nil || fast < 0 {
		errs = append(errs, &server.FieldError{Field: "fast-interval", Value: *fastInterval, Msg: "want a duration such as 100ms, or 0 for off"})
	}
	if fast == 0 {
		fast = -1
	}
	maxBytes, maxRecords := num("spool-max-bytes", *spoolMax, 1), num("batch-max-records", *batchMax, 1)
	sendBytes := num("batch-max-bytes", *batchBytes, 1024)
	nFake := num("fake-nvml-gpus", *fakeGPUs, 0)
	limits := httpf.parse(&errs)
	httplimit.SetMemoryLimit(limits.MaxInflightBytes)
	var limitErrs []error
	limits.Validate(func(field, value, msg string) {
		limitErrs = append(limitErrs, &server.FieldError{Field: field, Value: value, Msg: msg})
	})
	errs = append(errs, unreportedFieldErrors(errors.Join(limitErrs...), errs)...)
	if len(errs) > 0 {
		return configError("collect", errs)
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

	token, err := tokenFile.value()
	if err != nil {
		return fmt.Errorf("collect: %w", err)
	}

	var lib nvml.Iface
	switch {
	case *noGPU:
	case *fakeGPU != "":
		cp, err := nvml.LoadCapture(*fakeGPU)
		if err != nil {
			return fmt.Errorf("collect: fake-nvml: %w", err)
		}
		lib = nvml.NewFake(cp, int(nFake))
	default:
		lib = &nvml.Real{LibPath: *nvmlLib}
	}
	if *capture != "" && lib != nil {
		lib = &nvml.Recorder{Inner: lib, Path: *capture, Source: "deepseed collect " + Version}
	}
	spool, err := filepath.Abs(*spoolDir)
	if err != nil {
		return fmt.Errorf("collect: spool-dir: %w", err)
	}
	log.Info("spool directory: batches wait here while the server is away", "dir", spool, "max_bytes", maxBytes)
	col, err := collector.New(collector.Config{
		Server: *serverURL, Token: token, HookListen: *hookListen, MetricsListen: *metricsListen,
		Interval: every, FastInterval: fast, CounterInterval: counters,
		EnergyInterval: energyEvery, GPMInterval: gpmEvery, ProcessInterval: procEvery, SpoolDir: spool, SpoolMaxBytes: maxBytes, HostName: *hostName,
		DCGMCompat: *dcgm, BatchMaxRecords: int(maxRecords), BatchMaxBytes: int(sendBytes), BatchMaxAge: maxAge, ProcRoot: *procRoot,
		NVML: lib, Logger: log, HTTP: limits,
	})
	if err != nil {
		return fmt.Errorf("collect: %w", err)
	}
	return col.Run(ctx)
}

// pprofNote is the help's line about DEEPSEED_PPROF_LISTEN, which only
// the environment sets.
const pprofNote = `DEEPSEED_PPROF_LISTEN=127.0.0.1:6060 (environment only) serves the Go
profiler at /debug/pprof/ on that address, for measuring under load
(docs/performance.md).`

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
