// Package collector is DeepSeed's node collector: it samples the GPUs
// through NVML and the host through /proc, receives the training hook's
// records on a local socket, batches everything and forwards it to the
// server's ingest API, spooling to disk while the server is away, and
// serves /metrics.
//
// Usage:
//  1. c, err := collector.New(collector.Config{Server: …, SpoolDir: …, NVML: &nvml.Real{}})
//  2. err = c.Run(ctx) — until ctx is cancelled; then the queue is flushed
//     to the server or to the spool.
//
// Tests build a Collector over [nvml.Fake] and a fixture /proc and call
// [Collector.SampleOnce] and [Collector.WriteMetrics] directly.
package collector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deepseed/deepseed/collector/nvml"
	"github.com/deepseed/deepseed/internal/httplimit"
)

// Config configures a Collector. Zero values take the defaults noted.
type Config struct {
	// Server is the DeepSeed server's base URL; empty disables forwarding.
	Server string
	Token  string
	// HookListen is host:port or unix:/path for the hook receiver.
	HookListen string
	// MetricsListen is host:port for /metrics; empty disables it.
	MetricsListen string
	Interval      time.Duration // base sampling period; default 1s
	// FastInterval is the sampling period of GPUs that a training process
	// announced by the hook holds; default 250ms, negative turns adaptive
	// sampling off. At or above Interval it is off too.
	FastInterval time.Duration
	// CounterInterval is how often the costly counters are read (PCIe,
	// NVLink, ECC, remapped rows); default 30s, at least Interval.
	CounterInterval time.Duration
	// EnergyInterval is how often the energy counter is read; between
	// reads the collector adds up the power it samples (see gpuSampler).
	// Default 5m, at least CounterInterval.
	EnergyInterval time.Duration
	// GPMInterval is how often GPM metrics are read on a GPU that a
	// training process holds (others read them with the counters); the
	// metrics are averages over the time between two reads. Default 5s,
	// at least Interval.
	GPMInterval time.Duration
	// ProcessInterval is how often each GPU's compute processes are read
	// when nothing says they changed; an announced training process
	// arriving or leaving has them read at the next sample. Default 5s,
	// at least Interval.
	ProcessInterval time.Duration
	SpoolDir        string // required when Server is set
	SpoolMaxBytes   int64  // default 1 GiB
	HostName        string // default os.Hostname()
	DCGMCompat      bool   // also export dcgm-exporter names
	// BatchMaxRecords, BatchMaxBytes and BatchMaxAge cut the batches of
	// samples; defaults 5000, 4 MiB (uncompressed) and 1s. The first two
	// also bound one send: the oldest spooled batches go to the server
	// together up to both.
	BatchMaxRecords int
	BatchMaxBytes   int
	BatchMaxAge     time.Duration
	ProcRoot        string     // default /proc
	NVML            nvml.Iface // nil: no GPU sampling
	Logger          *slog.Logger
	Now             func() time.Time
	HTTPClient      *http.Client
	// ShutdownTimeout bounds the final flush; default 5s.
	ShutdownTimeout time.Duration
	// HTTP bounds what clients of the hook receiver and /metrics can make
	// the collector hold; fields left zero take httplimit's defaults.
	HTTP httplimit.Limits
}

// The default intervals. On an H100 with real NVML (collector/gpubench) a
// GPU sampled every 100 ms costs about 0.25 % of a core, so eight GPUs
// held by training cost 2 %; at 250 ms half that, still four samples a
// second for short runs. The counters cost up to milliseconds a read and
// change slowly; the energy counter costs 3 ms of CPU a read on an idle
// H100 and 15 ms on a busy one, so it is read least often and the power
// samples fill in between. GPM costs about 0.6 ms a read on a busy GPU,
// the process list 0.1 ms.
const (
	DefaultFastInterval    = 250 * time.Millisecond
	DefaultCounterInterval = 30 * time.Second
	DefaultEnergyInterval  = 5 * time.Minute
	DefaultGPMInterval     = 5 * time.Second
	DefaultProcessInterval = 5 * time.Second
	// DefaultBatchMaxBytes bounds one send. At 10,000 records a second a
	// send of a few thousand records keeps pace where one spool file (a
	// group commit, often tens of records) a send did not; 4 MiB is a few
	// hundred kilobytes gzipped, far below the server's body bound.
	DefaultBatchMaxBytes = 4 << 20
)

// Validate fills defaults and checks the configuration; errors name the
// field.
func (cfg *Config) Validate() error {
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	if cfg.Interval < 10*time.Millisecond {
		return fmt.Errorf("interval: %v is too short (want at least 10ms)", cfg.Interval)
	}
	switch {
	case cfg.FastInterval == 0:
		cfg.FastInterval = DefaultFastInterval
	case cfg.FastInterval > 0 && cfg.FastInterval < 10*time.Millisecond:
		return fmt.Errorf("fast-interval: %v is too short (want at least 10ms, or 0 for off)", cfg.FastInterval)
	}
	if cfg.FastInterval >= cfg.Interval {
		cfg.FastInterval = -1
	}
	if cfg.CounterInterval == 0 {
		cfg.CounterInterval = DefaultCounterInterval
	}
	if cfg.CounterInterval < 0 {
		return fmt.Errorf("counter-interval: want a positive duration, got %v", cfg.CounterInterval)
	}
	cfg.CounterInterval = max(cfg.CounterInterval, cfg.Interval)
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"energy-interval", &cfg.EnergyInterval, DefaultEnergyInterval},
		{"gpm-interval", &cfg.GPMInterval, DefaultGPMInterval},
		{"process-interval", &cfg.ProcessInterval, DefaultProcessInterval},
	} {
		if *d.v == 0 {
			*d.v = d.def
		}
		if *d.v < 0 {
			return fmt.Errorf("%s: want a positive duration, got %v", d.name, *d.v)
		}
		*d.v = max(*d.v, cfg.Interval)
	}
	cfg.EnergyInterval = max(cfg.EnergyInterval, cfg.CounterInterval)
	if cfg.SpoolMaxBytes == 0 {
		cfg.SpoolMaxBytes = 1 << 30
	}
	if cfg.SpoolMaxBytes < 0 {
		return fmt.Errorf("spool-max-bytes: want a positive size, got %d", cfg.SpoolMaxBytes)
	}
	if cfg.BatchMaxRecords == 0 {
		cfg.BatchMaxRecords = 5000
	}
	if cfg.BatchMaxRecords < 0 || cfg.BatchMaxRecords > 100000 {
		return fmt.Errorf("batch-max-records: want 1 to 100000, got %d", cfg.BatchMaxRecords)
	}
	if cfg.BatchMaxBytes == 0 {
		cfg.BatchMaxBytes = DefaultBatchMaxBytes
	}
	if cfg.BatchMaxBytes < 1024 || cfg.BatchMaxBytes > 32<<20 {
		return fmt.Errorf("batch-max-bytes: want 1024 to %d (the server's default body bound), got %d", 32<<20, cfg.BatchMaxBytes)
	}
	if cfg.BatchMaxAge == 0 {
		cfg.BatchMaxAge = time.Second
	}
	if cfg.BatchMaxAge < 0 {
		return fmt.Errorf("batch-max-age: want a positive duration, got %v", cfg.BatchMaxAge)
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.HostName == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("host-name: cannot read the host name, set it: %w", err)
		}
		cfg.HostName = h
	}
	if cfg.Server != "" {
		if !strings.HasPrefix(cfg.Server, "http://") && !strings.HasPrefix(cfg.Server, "https://") {
			return fmt.Errorf("server: want an http:// or https:// URL, got %q", cfg.Server)
		}
	}
	if cfg.SpoolDir == "" {
		return errors.New("spool-dir: required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 5 * time.Second
	}
	cfg.HTTP = cfg.HTTP.WithDefaults()
	return nil
}

// Collector samples, receives, batches and forwards.
type Collector struct {
	cfg   Config
	log   *slog.Logger
	reg   *registry
	gpu   gpuSampler
	hostS hostSampler
	spool *spool
	queue *queue
	batch *batcher
	fwd   *forwarder
	dead  *deadLetter
	m     *collectorMetrics
	seq   atomic.Uint64
	hook  committer

	// Spool trouble is logged once per burst, not once per batch.
	dropLog, fullLog burstLog

	snapMu sync.Mutex
	gpus   []gpuState
	host   *hostReading
	// nextBase is the next base tick: the host and every GPU are sampled.
	nextBase time.Time

	gpuErrOnce, hostErrOnce sync.Once
}

// New opens the spool and prepares the NVML library; a missing library is
// not an error: the collector runs without GPU sampling and says so once.
func New(cfg Config) (*Collector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Collector{cfg: cfg, log: cfg.Logger, reg: newRegistry()}
	c.hostS.root = cfg.ProcRoot
	c.m = newCollectorMetrics(c)
	sp, err := openSpool(cfg.SpoolDir, cfg.SpoolMaxBytes, func(n int) {
		c.m.droppedFull.Add(n)
		if total, ok := c.dropLog.note(c.now(), n); ok {
			c.log.Warn("spool over its bound: sampled records dropped to make room (acknowledged hook records are kept)", "records", total, "spool_max_bytes", cfg.SpoolMaxBytes)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("spool-dir: %w", err)
	}
	sp.now = cfg.Now
	c.spool = sp
	c.seq.Store(sp.nextSeq() - 1)
	c.queue = newQueue(sp, func(b *batch, err error) {
		if errors.Is(err, errSpoolFull) {
			// The hook's acknowledged records fill the spool: the newest
			// samples go, they do not.
			sp.onDrop(b.N)
			return
		}
		c.m.droppedWrite.Add(b.N)
		if total, ok := c.dropLog.note(c.now(), b.N); ok {
			c.log.Error("spool write failed: sampled records dropped", "records", total, "err", err)
		}
	})
	c.hook.write = c.spoolHookRecords
	c.batch = &batcher{maxRecords: cfg.BatchMaxRecords, maxBytes: cfg.BatchMaxBytes, maxAge: cfg.BatchMaxAge,
		out: c.queue.push, seq: func() uint64 { return c.seq.Add(1) }, started: make(chan struct{}, 1)}
	c.dead = &deadLetter{path: filepath.Join(cfg.SpoolDir, "dead-letter.ndjson")}
	if cfg.Server != "" {
		c.fwd = &forwarder{url: strings.TrimRight(cfg.Server, "/") + "/api/v1/ingest", token: cfg.Token, client: cfg.HTTPClient}
	}
	if cfg.NVML != nil {
		if err := cfg.NVML.Init(); err != nil {
			c.log.Warn("GPU sampling is off", "reason", err.Error())
		} else {
			c.gpu = newGPUSampler(cfg.NVML, gpuIntervals{base: cfg.Interval, fast: max(cfg.FastInterval, 0), counter: cfg.CounterInterval,
				energy: cfg.EnergyInterval, gpm: cfg.GPMInterval, procs: cfg.ProcessInterval})
			c.m.gpuUp.Store(true)
			c.log.Info("GPU sampling on", "gpus", len(c.gpu.devs))
		}
	} else {
		c.log.Info("GPU sampling is off", "reason", "not asked for (--no-gpu)")
	}
	if sp.len() > 0 {
		c.log.Info("spool holds batches from before: replaying them first", "batches", sp.len(), "bytes", sp.size())
	}
	return c, nil
}

func (c *Collector) now() time.Time { return c.cfg.Now() }

// queueDepth counts the records waiting to be sent: in the spool, and
// sampled ones not yet in a batch.
func (c *Collector) queueDepth() int {
	n, _ := c.spool.counts()
	return c.batch.pending() + n
}

// enqueue adds one JSON record to the outgoing batches; without a server
// there is nowhere to send it.
func (c *Collector) enqueue(rec []byte, now time.Time) {
	if c.fwd == nil {
		return
	}
	c.batch.add(rec, now)
}

// spoolHookRecords writes a group of the hook's records to the spool as
// one batch, if it fits; the receiver acknowledges them only then.
func (c *Collector) spoolHookRecords(lines [][]byte) error {
	if len(lines) == 0 {
		return nil
	}
	size := 0
	for _, l := range lines {
		size += len(l) + 1
	}
	body := make([]byte, 0, size)
	for _, l := range lines {
		body = append(append(body, l...), '\n')
	}
	return c.queue.pushFitting(&batch{Seq: c.seq.Add(1), N: len(lines), Body: body})
}

// SampleOnce samples the GPUs and the host once, as on a base tick,
// updates /metrics and queues the records.
func (c *Collector) SampleOnce() {
	c.sample(c.now(), true)
}

// sampleDue samples what is due at now and returns when the next sample
// is: the next base tick, or a fast GPU's sample before it.
func (c *Collector) sampleDue(now time.Time) time.Time {
	base := !now.Before(c.nextBase)
	c.sample(now, base)
	if c.m.gpuUp.Load() {
		return c.gpu.nextFast(c.nextBase)
	}
	return c.nextBase
}

// sample reads the GPUs due at now and, on a base tick, the host.
func (c *Collector) sample(now time.Time, base bool) {
	if base {
		c.nextBase = c.nextBase.Add(c.cfg.Interval)
		if !now.Before(c.nextBase) {
			c.nextBase = now.Add(c.cfg.Interval)
		}
	}
	var gpus []gpuState
	var fresh []int
	if c.m.gpuUp.Load() {
		var err error
		gpus, fresh, err = c.gpu.sample(now, base, c.cfg.HostName, c.reg)
		if err != nil {
			c.gpuErrOnce.Do(func() { c.log.Warn("GPU read failed", "err", err) })
		}
	}
	var host hostReading
	var herr error
	if base {
		host, herr = c.hostS.sample(now, c.cfg.HostName, c.reg.list())
		if herr != nil {
			c.hostErrOnce.Do(func() { c.log.Warn("host sampling failed", "err", herr) })
		}
		c.m.hostUp.Store(herr == nil)
		for _, p := range host.procs {
			if p.gone {
				c.reg.forget(p.p.PID)
				c.log.Info("training process exited", "pid", p.p.PID, "run_id", p.p.RunID, "rank", p.p.Rank)
			}
		}
	}
	c.snapMu.Lock()
	c.gpus = gpus
	if base {
		c.host = &host
	}
	c.snapMu.Unlock()
	for _, i := range fresh {
		if b, err := json.Marshal(&c.gpu.dev[i].state.rec); err == nil {
			c.enqueue(b, now)
		}
	}
	if base && (herr == nil || host.rec.MemTotalBytes != nil || host.rec.CPUUtilPct != nil) {
		if b, err := json.Marshal(&host.rec); err == nil {
			c.enqueue(b, now)
		}
	}
}

// Run serves the hook receiver and /metrics, samples every Interval and
// forwards until ctx is done; then it flushes what is queued to the server
// or to the spool and returns.
func (c *Collector) Run(ctx context.Context) error {
	hookLn, err := listen(c.cfg.HookListen)
	if err != nil {
		return fmt.Errorf("hook-listen: %w", err)
	}
	hookSrv := c.cfg.HTTP.Server(c, c.log)
	var servers []*http.Server
	servers = append(servers, hookSrv)
	errc := make(chan error, 2)
	go func() { errc <- hookSrv.Serve(c.cfg.HTTP.Listener(hookLn, c.log)) }()
	c.log.Info("hook receiver listening", "addr", c.cfg.HookListen, "max_conns", c.cfg.HTTP.MaxConns,
		"body_timeout", c.cfg.HTTP.BodyTimeout.String())
	if c.cfg.MetricsListen != "" {
		mln, err := net.Listen("tcp", c.cfg.MetricsListen)
		if err != nil {
			hookSrv.Close()
			return fmt.Errorf("metrics-listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", c.MetricsHandler())
		msrv := c.cfg.HTTP.Server(mux, c.log)
		servers = append(servers, msrv)
		go func() { errc <- msrv.Serve(c.cfg.HTTP.Listener(mln, c.log)) }()
		c.log.Info("metrics listening", "addr", c.cfg.MetricsListen)
	}
	if c.fwd == nil {
		c.log.Warn("no server configured: records are sampled and shown on /metrics but not forwarded")
	}

	fwdCtx, stopFwd := context.WithCancel(context.Background())
	fwdDone := make(chan struct{})
	go func() {
		defer close(fwdDone)
		if c.fwd != nil {
			c.forwardLoop(fwdCtx)
		}
	}()

	// One timer for sampling, armed for the next base tick or, while a
	// training process holds a GPU, that GPU's next fast sample.
	tick := time.NewTimer(time.Hour)
	defer tick.Stop()
	// One timer for the pending batch's age, armed when a batch opens:
	// an idle or steady collector wakes once per batch, not on a poll.
	batchTimer := time.NewTimer(time.Hour)
	batchTimer.Stop()
	defer batchTimer.Stop()
	batchArmed := false
	armBatch := func() {
		if dl, ok := c.batch.deadline(); ok {
			batchTimer.Reset(max(dl.Sub(c.now()), 0))
			batchArmed = true
		}
	}
	tick.Reset(max(c.sampleDue(c.now()).Sub(c.now()), 0))
	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err := <-errc:
			runErr = fmt.Errorf("listener: %w", err)
			break loop
		case <-tick.C:
			tick.Reset(max(c.sampleDue(c.now()).Sub(c.now()), 0))
		case <-c.batch.started:
			if !batchArmed {
				armBatch()
			}
		case <-batchTimer.C:
			batchArmed = false
			c.batch.tick(c.now(), false)
			// A younger batch may already be pending: wait for its age.
			armBatch()
		}
	}
	// Stop taking records, then hand every pending one to the queue.
	sctx, cancel := context.WithTimeout(context.Background(), c.cfg.ShutdownTimeout)
	defer cancel()
	for _, s := range servers {
		s.Shutdown(sctx)
	}
	c.batch.tick(c.now(), true)
	stopFwd()
	<-fwdDone
	if c.cfg.NVML != nil && c.m.gpuUp.Load() {
		c.cfg.NVML.Shutdown()
	}
	// Sampling ran on this goroutine only, so its files close here.
	c.hostS.close()
	return runErr
}

func listen(addr string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		// A socket left by a previous run would make Listen fail.
		if fi, err := os.Stat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
			os.Remove(path)
		}
		return net.Listen("unix", path)
	}
	return net.Listen("tcp", addr)
}
