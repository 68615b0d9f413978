package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/deepseed/deepseed/internal/localpg"
	"github.com/deepseed/deepseed/store"
)

const collectorBenchNotes = `
The collector bench runs the node's data path on this machine, loopback
only: a private PostgreSQL, a deepseed server and a deepseed collector,
each a real process. --ranks simulated ranks of one run post to the
collector's hook receiver for --duration: each rank --rate steps a second
(a step record, and with --layers N a layers record of N layers too), in --posts requests
a second, as the hook does (a request answered 503 or not at all is sent
again after Retry-After or 100 ms). Every second it reads the collector's
/metrics and prints the records acknowledged and forwarded per second, the
backlog (records, bytes) and the forwarding lag (age of the oldest unsent
acknowledged record). Then it waits for the backlog to drain and prints:
records/s acknowledged and forwarded, the p50/p99/max acknowledgement
latency (from a request's due time to its 200), the lag from acknowledgement
to the database (the server answers the collector only once a batch is
committed; the k-th record forwarded is matched with the k-th acknowledged,
sampled every 100 ms), the time to drain after the last acknowledgement,
and, by SQL, records lost or stored twice. It exits 1 if any acknowledged
record is missing or stored twice.`

// collectorBench is one run of the collector bench.
type collectorBench struct {
	bin, dir, token   string
	ranks, rate       int
	posts             int
	layers            int
	layerRec          string // the names and times of a layers record
	duration, drain   time.Duration
	collectFlags      []string
	run               string
	serverPort        int
	hookPort, metPort int
	pg                *localpg.Cluster
	dbURL             string
	procs             []*exec.Cmd
	logs              []*bytes.Buffer

	mu      sync.Mutex
	acks    []ackPoint      // cumulative records acknowledged, in time order
	latency []time.Duration // per request, due time to 200
	retries int
}

type ackPoint struct {
	t time.Time
	n int64
}

func runCollectorBench(ctx context.Context, args []string) error {
	f := newEnvFlags("bench collector")
	ranks := f.String("ranks", "DEEPSEED_BENCH_RANKS", "1000", "simulated ranks, one run")
	rate := f.String("rate", "DEEPSEED_BENCH_RATE", "10", "steps a second each rank records")
	posts := f.String("posts", "DEEPSEED_BENCH_POSTS", "1", "requests a second each rank sends (its steps split among them)")
	layers := f.String("layers", "DEEPSEED_BENCH_LAYERS", "0", "layers of the model: with more than 0, a layers record with every step record, as the hook sends")
	duration := f.String("duration", "DEEPSEED_BENCH_DURATION", "30s", "how long the ranks post")
	drain := f.String("drain-timeout", "DEEPSEED_BENCH_DRAIN_TIMEOUT", "5m", "longest wait for the backlog to drain afterwards")
	binFlag := f.String("binary", "DEEPSEED_BENCH_BINARY", "", "deepseed binary to run (default: this one)")
	flags := f.String("collect-flags", "DEEPSEED_BENCH_COLLECT_FLAGS", "", "extra flags for deepseed collect, space-separated")
	pgFsync := f.Bool("pg-fsync", "DEEPSEED_BENCH_PG_FSYNC", true, "PostgreSQL with fsync on, as in production")
	keep := f.Bool("keep", "DEEPSEED_BENCH_KEEP", false, "keep the working directory")
	f.setUsage("deepseed bench collector [flags]", "Drive one collector with many ranks and measure what it acknowledges and forwards.", collectorBenchNotes)
	if err := f.parse(args); err != nil {
		return err
	}
	var errs []error
	b := &collectorBench{ranks: wholeAtLeast(&errs, "ranks", *ranks, 1), rate: wholeAtLeast(&errs, "rate", *rate, 1),
		posts: wholeAtLeast(&errs, "posts", *posts, 1), layers: wholeAtLeast(&errs, "layers", *layers, 0), collectFlags: strings.Fields(*flags)}
	var err1, err2 error
	b.duration, err1 = time.ParseDuration(*duration)
	b.drain, err2 = time.ParseDuration(*drain)
	if err1 != nil || err2 != nil || b.duration < time.Second || b.drain <= 0 {
		errs = append(errs, errors.New("--duration and --drain-timeout: want durations, --duration at least 1s"))
	}
	if len(errs) > 0 {
		return configError("bench collector", errs)
	}
	b.layerRec = layersJSON(b.layers)
	b.bin = *binFlag
	if b.bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("bench collector: %w", err)
		}
		b.bin = exe
	}
	dir, err := benchDir("deepseed-bench-collector-")
	if err != nil {
		return fmt.Errorf("bench collector: %w", err)
	}
	b.dir = dir
	if !*keep {
		defer os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "working directory: %s\n", dir)
	}
	b.token, b.run = "bench-"+randomTag(), "bench-collector-"+randomTag()
	defer b.stop()
	if err := b.start(ctx, *pgFsync); err != nil {
		return fmt.Errorf("bench collector: %w", err)
	}
	return b.measure(ctx)
}

// start brings up PostgreSQL, the server and the collector.
func (b *collectorBench) start(ctx context.Context, fsync bool) error {
	b.pg = &localpg.Cluster{Dir: filepath.Join(b.dir, "pg"), Fsync: fsync}
	var err error
	if b.dbURL, err = b.pg.Start(ctx); err != nil {
		return fmt.Errorf("start PostgreSQL: %w", err)
	}
	b.serverPort, b.hookPort, b.metPort = freeLoopbackPort(), freeLoopbackPort(), freeLoopbackPort()
	if err := b.spawn([]string{"DEEPSEED_INGEST_TOKENS=" + b.token}, "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", b.serverPort),
		"--database-url", b.dbURL, "--log-level", "warn"); err != nil {
		return err
	}
	if err := waitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", b.serverPort), 200); err != nil {
		return err
	}
	args := append([]string{"collect", "--server", fmt.Sprintf("http://127.0.0.1:%d", b.serverPort),
		"--hook-listen", fmt.Sprintf("127.0.0.1:%d", b.hookPort), "--metrics-listen", fmt.Sprintf("127.0.0.1:%d", b.metPort),
		"--no-gpu", "--interval", "1h", "--spool-dir", filepath.Join(b.dir, "spool"), "--log-level", "warn"}, b.collectFlags...)
	if err := b.spawn([]string{"DEEPSEED_TOKEN=" + b.token}, args...); err != nil {
		return err
	}
	return waitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", b.metPort), 200)
}

func (b *collectorBench) spawn(env []string, args ...string) error {
	cmd := exec.Command(b.bin, args...)
	cmd.Env = append(os.Environ(), env...)
	buf := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = buf, buf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", args[0], err)
	}
	b.procs = append(b.procs, cmd)
	b.logs = append(b.logs, buf)
	return nil
}

func (b *collectorBench) stop() {
	for i := len(b.procs) - 1; i >= 0; i-- {
		cmd := b.procs[i]
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
	}
	if b.pg != nil {
		_ = b.pg.Stop()
	}
}

// body is rank r's request number i: its share of the steps of one second,
// a step record (and a layers record) per step.
func (b *collectorBench) body(r, i int) []byte {
	per := b.rate / b.posts
	first := int64(i*per + min(i%b.posts, b.rate%b.posts))
	if i%b.posts < b.rate%b.posts {
		per++
	}
	var buf bytes.Buffer
	for s := first; s < first+int64(per); s++ {
		t := 1700000000 + float64(s)/float64(b.rate)
		fmt.Fprintf(&buf, `{"kind":"step","run_id":%q,"rank":%d,"step":%d,"time":%.3f,"loss":%.4f,"lr":2e-5,"step_ms":98.5,"forward_ms":30.1,"backward_ms":55.2,"optimizer_ms":10.3,"data_ms":2.9}`+"\n",
			b.run, r, s, t, 2.5-float64(s)/1e4)
		if b.layers > 0 {
			fmt.Fprintf(&buf, `{"kind":"layers","run_id":%q,"rank":%d,"step":%d,"time":%.3f,%s}`+"\n", b.run, r, s, t, b.layerRec)
		}
	}
	return buf.Bytes()
}

func (b *collectorBench) metricsAddr() string { return fmt.Sprintf("127.0.0.1:%d", b.metPort) }

// layersJSON is the names and per-layer times of a model of n layers.
func layersJSON(n int) string {
	var names, fwd, bwd []string
	for i := 0; i < n; i++ {
		names = append(names, strconv.Quote(fmt.Sprintf("model.layers.%d", i)))
		fwd = append(fwd, fmt.Sprintf("%.2f", 1+float64(i%7)/10))
		bwd = append(bwd, fmt.Sprintf("%.2f", 2+float64(i%5)/10))
	}
	return fmt.Sprintf(`"names":[%s],"forward_ms":[%s],"backward_ms":[%s]`, strings.Join(names, ","), strings.Join(fwd, ","), strings.Join(bwd, ","))
}

// perStep is the records each step adds.
func (b *collectorBench) perStep() int {
	if b.layers > 0 {
		return 2
	}
	return 1
}

// rank posts rank r's requests on schedule until the duration is over,
// each until it is acknowledged.
func (b *collectorBench) rank(ctx context.Context, client *http.Client, begin time.Time, r int) {
	url := fmt.Sprintf("http://127.0.0.1:%d/api/v1/ingest", b.hookPort)
	every := time.Second / time.Duration(b.posts)
	offset := time.Duration(r) * every / time.Duration(b.ranks)
	n := int(b.duration / every)
	for i := 0; i < n; i++ {
		due := begin.Add(offset + time.Duration(i)*every)
		if d := time.Until(due); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		body := b.body(r, i)
		recs := int64(bytes.Count(body, []byte{'\n'}))
		for try := 0; ; try++ {
			wait := 100 * time.Millisecond
			resp, err := client.Post(url, "application/x-ndjson", bytes.NewReader(body))
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					now := time.Now()
					b.mu.Lock()
					last := int64(0)
					if len(b.acks) > 0 {
						last = b.acks[len(b.acks)-1].n
					}
					b.acks = append(b.acks, ackPoint{now, last + recs})
					b.latency = append(b.latency, now.Sub(due))
					b.retries += try
					b.mu.Unlock()
					break
				}
				if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
					wait = time.Duration(s) * time.Second
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
	}
}

// scrapeCollector reads a collector's own figures (deepseed_collector_*)
// from its /metrics at addr, by name with labels.
func scrapeCollector(ctx context.Context, addr string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", addr, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || !strings.HasPrefix(name, "deepseed_collector_") {
			continue
		}
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			out[name] = v
		}
	}
	return out, sc.Err()
}

type fwdPoint struct {
	t         time.Time
	forwarded float64
}

func (b *collectorBench) acked() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.acks) == 0 {
		return 0
	}
	return b.acks[len(b.acks)-1].n
}

// measure drives the load, prints the figures every second and then the
// summary, and checks the database.
func (b *collectorBench) measure(ctx context.Context) error {
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConns: b.ranks + 8, MaxIdleConnsPerHost: b.ranks + 8, IdleConnTimeout: time.Minute}}
	defer client.CloseIdleConnections()
	// The collector's first host sample is forwarded before the clock
	// starts, so that the forwarded count is the hook's records alone.
	var m0 map[string]float64
	for wait := time.Now().Add(10 * time.Second); ; {
		m, err := scrapeCollector(ctx, b.metricsAddr())
		if err != nil {
			return fmt.Errorf("bench collector: read /metrics: %w", err)
		}
		if m0 = m; (m["deepseed_collector_records_forwarded_total"] > 0 && m["deepseed_collector_queue_records"] == 0) || time.Now().After(wait) {
			break
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
	fwd0 := m0["deepseed_collector_records_forwarded_total"]
	var sendErrs float64
	total := int64(b.ranks) * int64(b.duration/time.Second) * int64(b.rate) * int64(b.perStep())
	fmt.Printf("collector bench: %d ranks × %d steps/s × %d records, %d posts/s each, %s: %d records (%.0f/s offered)\n",
		b.ranks, b.rate, b.perStep(), b.posts, b.duration, total, float64(total)/b.duration.Seconds())
	fmt.Printf("%6s %10s %10s %10s %12s %9s\n", "t", "acked/s", "fwd/s", "backlog", "backlog_MB", "lag_s")

	sendCtx, stopSend := context.WithCancel(ctx)
	defer stopSend()
	begin := time.Now().Add(100 * time.Millisecond)
	var wg sync.WaitGroup
	for r := 0; r < b.ranks; r++ {
		wg.Add(1)
		go func() { defer wg.Done(); b.rank(sendCtx, client, begin, r) }()
	}
	sendersDone := make(chan struct{})
	go func() { wg.Wait(); close(sendersDone) }()

	var fwd []fwdPoint
	var maxBacklog, maxBytes, maxLag float64
	lastPrint, lastAcked, lastFwd := begin, int64(0), 0.0
	var lastAck time.Time
	sending := true
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		case <-sendersDone:
			sendersDone = nil
			sending = false
			b.mu.Lock()
			if len(b.acks) > 0 {
				lastAck = b.acks[len(b.acks)-1].t
			}
			b.mu.Unlock()
			deadline = time.Now().Add(b.drain)
			continue
		}
		m, err := scrapeCollector(ctx, b.metricsAddr())
		if err != nil {
			continue
		}
		now := time.Now()
		f := m["deepseed_collector_records_forwarded_total"] - fwd0
		fwd = append(fwd, fwdPoint{now, f})
		sendErrs = m["deepseed_collector_send_errors_total"] - m0["deepseed_collector_send_errors_total"]
		backlog, bytesQ, lag := m["deepseed_collector_queue_records"], m["deepseed_collector_spool_bytes"], m["deepseed_collector_forward_lag_seconds"]
		maxBacklog, maxBytes, maxLag = max(maxBacklog, backlog), max(maxBytes, bytesQ), max(maxLag, lag)
		if now.Sub(lastPrint) >= time.Second {
			a := b.acked()
			dt := now.Sub(lastPrint).Seconds()
			fmt.Printf("%6.1f %10.0f %10.0f %10.0f %12.1f %9.2f\n", now.Sub(begin).Seconds(), float64(a-lastAcked)/dt, (f-lastFwd)/dt, backlog, bytesQ/1e6, lag)
			lastPrint, lastAcked, lastFwd = now, a, f
		}
		if !sending && f >= float64(b.acked()) && backlog == 0 {
			break
		}
		if !sending && now.After(deadline) {
			fmt.Printf("backlog not drained after %s\n", b.drain)
			break
		}
	}
	if sendErrs > 0 {
		fmt.Printf("send errors:  %.0f sends to the server failed and were sent again\n", sendErrs)
	}
	return b.report(ctx, begin, lastAck, fwd, maxBacklog, maxBytes, maxLag)
}

// report prints the summary and checks the database.
func (b *collectorBench) report(ctx context.Context, begin, lastAck time.Time, fwd []fwdPoint, maxBacklog, maxBytes, maxLag float64) error {
	b.mu.Lock()
	acks, lat, retries := b.acks, b.latency, b.retries
	b.mu.Unlock()
	if len(acks) == 0 || len(fwd) == 0 {
		return errors.New("bench collector: nothing was acknowledged")
	}
	acked := acks[len(acks)-1].n
	sendSecs := lastAck.Sub(begin).Seconds()
	end := fwd[len(fwd)-1]
	// The lag of the records forwarded by each sample: the time since the
	// same count was acknowledged, weighted by the records forwarded.
	type lagW struct {
		d time.Duration
		w float64
	}
	var lags []lagW
	var weight float64
	prev := 0.0
	fwdAtLastAck := 0.0
	for _, p := range fwd {
		if p.forwarded > prev {
			i := sort.Search(len(acks), func(i int) bool { return float64(acks[i].n) >= p.forwarded })
			if i < len(acks) {
				// Stored before the sender saw its 200 counts as no lag.
				lags = append(lags, lagW{max(p.t.Sub(acks[i].t), 0), p.forwarded - prev})
				weight += p.forwarded - prev
			}
			prev = p.forwarded
		}
		if !p.t.After(lastAck) {
			fwdAtLastAck = p.forwarded
		}
	}
	sort.Slice(lags, func(i, j int) bool { return lags[i].d < lags[j].d })
	lagQ := func(q float64) time.Duration {
		acc := 0.0
		for _, l := range lags {
			acc += l.w
			if acc >= q*weight {
				return l.d
			}
		}
		return 0
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	fmt.Printf("acknowledged: %d records in %.1fs = %.0f records/s (%d requests, %d sent again)\n", acked, sendSecs, float64(acked)/sendSecs, len(lat), retries)
	fmt.Printf("forwarded:    %.0f records while the ranks posted = %.0f records/s; all %.0f by %.1fs\n", fwdAtLastAck, fwdAtLastAck/sendSecs, end.forwarded, end.t.Sub(begin).Seconds())
	fmt.Printf("ack latency:  p50 %s, p99 %s, max %s\n", quantile(lat, 0.5).Round(time.Millisecond), quantile(lat, 0.99).Round(time.Millisecond), quantile(lat, 1).Round(time.Millisecond))
	fmt.Printf("ack → stored: p50 %s, p99 %s, max %s (sampled every 100 ms)\n", lagQ(0.5).Round(time.Millisecond), lagQ(0.99).Round(time.Millisecond), lagQ(1).Round(time.Millisecond))
	fmt.Printf("backlog:      at most %.0f records, %.1f MB; forwarding lag at most %.2fs\n", maxBacklog, maxBytes/1e6, maxLag)
	fmt.Printf("drained:      %.1fs after the last acknowledgement\n", end.t.Sub(lastAck).Seconds())

	st, err := store.Open(ctx, b.dbURL, nil)
	if err != nil {
		return fmt.Errorf("bench collector: %w", err)
	}
	defer st.Close()
	stored, twice, err := st.CountStepRows(ctx, b.run, false)
	if err != nil {
		return fmt.Errorf("bench collector: count steps: %w", err)
	}
	if b.layers > 0 {
		l, lt, err := st.CountStepRows(ctx, b.run, true)
		if err != nil {
			return fmt.Errorf("bench collector: count layers: %w", err)
		}
		stored, twice = stored+l, twice+lt
	}
	fmt.Printf("database:     %d records stored for %d acknowledged, %d stored twice\n", stored, acked, twice)
	if stored != acked || twice > 0 {
		for _, l := range b.logs {
			fmt.Fprintf(os.Stderr, "--- log (last lines)\n%s\n", lastLinesOf(l.String(), 20))
		}
		return fmt.Errorf("bench collector: %d acknowledged, %d stored, %d stored twice", acked, stored, twice)
	}
	return nil
}
