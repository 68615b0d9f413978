package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// attackTarget is a running server or collector to attack: the address
// of its ingest route, the token it wants (if any) and its process.
type attackTarget struct {
	name  string
	addr  string // host:port
	token string
	pid   int
	// probe is a well-formed small request a user sends meanwhile.
	probe func() *http.Request
}

// attackResult is what a user of the target saw during one attack.
type attackResult struct {
	target, attack string
	peakRSS        int64 // bytes, the most sampled during the attack
	baseRSS        int64 // bytes, before it
	probes         int
	probeFailed    int             // probes not answered 200
	probeLatency   []time.Duration // of the answered ones
	attackers      int
	closed         int // attackers the target answered or disconnected
	statuses       map[int]int
}

func (r *attackResult) p(q float64) time.Duration {
	if len(r.probeLatency) == 0 {
		return 0
	}
	l := append([]time.Duration(nil), r.probeLatency...)
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	return l[min(len(l)-1, int(q*float64(len(l))))]
}

// The attacks of the chaos bench and of the tests: 40 connections that
// announce 32 MiB bodies and send nothing, 500 that trickle a body a byte
// at a time, 16 concurrent gzip bombs of 1 MB each.
const (
	silentClients   = 40
	silentAnnounced = 32 << 20
	trickleClients  = 500
	bombClients     = 16
	gzipBombBytes   = 1 << 20
)

// rssOf reads a process's resident memory from /proc/PID/status.
func rssOf(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// runAttack samples the target's memory and sends it probes while attack
// runs, and returns what was seen. attack returns the number of attacking
// clients and how many of them the target answered or disconnected.
func runAttack(ctx context.Context, t attackTarget, name string, attack func(ctx context.Context) (int, int, map[int]int)) *attackResult {
	res := &attackResult{target: t.name, attack: name, baseRSS: rssOf(t.pid)}
	actx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	wg.Add(2)
	go func() {
		defer wg.Done()
		for actx.Err() == nil {
			if r := rssOf(t.pid); r > 0 {
				mu.Lock()
				res.peakRSS = max(res.peakRSS, r)
				mu.Unlock()
			}
			sleepCtx(actx, 20*time.Millisecond)
		}
	}()
	go func() {
		defer wg.Done()
		client := &http.Client{Timeout: 30 * time.Second}
		for actx.Err() == nil {
			start := time.Now()
			resp, err := client.Do(t.probe())
			took := time.Since(start)
			ok := false
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				ok = resp.StatusCode == http.StatusOK
			}
			mu.Lock()
			res.probes++
			if ok {
				res.probeLatency = append(res.probeLatency, took)
			} else {
				res.probeFailed++
			}
			mu.Unlock()
			sleepCtx(actx, 100*time.Millisecond)
		}
	}()
	// Let the probes and the sampler start before the attack.
	sleepCtx(ctx, 300*time.Millisecond)
	res.attackers, res.closed, res.statuses = attack(ctx)
	sleepCtx(ctx, 300*time.Millisecond)
	stop()
	wg.Wait()
	return res
}

// slowBodies opens n connections to t, each sending a request's headers
// announcing announced bytes of body, then, when trickle, one byte of it
// every second, else nothing. It returns once each connection was answered
// or closed by the target, or wait passed; closed counts the former.
func slowBodies(t attackTarget, n int, announced int64, trickle bool, wait time.Duration) func(ctx context.Context) (int, int, map[int]int) {
	return func(ctx context.Context) (int, int, map[int]int) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		closed := 0
		statuses := map[int]int{}
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := net.DialTimeout("tcp", t.addr, 10*time.Second)
				if err != nil {
					return
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(wait))
				auth := ""
				if t.token != "" {
					auth = "Authorization: Bearer " + t.token + "\r\n"
				}
				fmt.Fprintf(c, "POST /api/v1/ingest HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-ndjson\r\n%sContent-Length: %d\r\n\r\n", t.addr, auth, announced)
				done := make(chan struct{})
				if trickle {
					go func() {
						for {
							select {
							case <-done:
								return
							case <-time.After(time.Second):
								if _, err := c.Write([]byte(" ")); err != nil {
									return
								}
							}
						}
					}()
				}
				br := bufio.NewReader(c)
				resp, err := http.ReadResponse(br, nil)
				status := 0
				if err == nil {
					status = resp.StatusCode
					io.Copy(io.Discard, resp.Body)
					_, err = br.ReadByte()
				}
				close(done)
				mu.Lock()
				defer mu.Unlock()
				statuses[status]++
				// Answered and closed, or closed without an answer: either
				// way the target let go. A deadline means it did not.
				if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
					closed++
				}
			}()
		}
		wg.Wait()
		return n, closed, statuses
	}
}

// gzipBomb returns a gzip stream of about size bytes that inflates to
// about a thousand times as much.
func gzipBomb(size int) []byte {
	var b bytes.Buffer
	w, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
	zeros := make([]byte, 1<<20)
	for b.Len() < size {
		w.Write(zeros)
	}
	w.Close()
	return b.Bytes()
}

// attackAll runs the three attacks on t in turn.
func attackAll(ctx context.Context, t attackTarget, bodyTimeout time.Duration, bomb []byte) []*attackResult {
	wait := 3*bodyTimeout + 30*time.Second
	return []*attackResult{
		runAttack(ctx, t, fmt.Sprintf("%d silent 32 MiB bodies", silentClients), slowBodies(t, silentClients, silentAnnounced, false, wait)),
		runAttack(ctx, t, fmt.Sprintf("%d trickling bodies", trickleClients), slowBodies(t, trickleClients, 1<<20, true, wait)),
		runAttack(ctx, t, fmt.Sprintf("%d×2 gzip bombs of 1 MB", bombClients), postBodies(t, posting{
			clients: bombClients, rounds: 2, body: bomb, gzip: true, timeout: 2 * time.Minute})),
	}
}

// printAttacks writes the attacks' table.
func printAttacks(w io.Writer, results []*attackResult) {
	fmt.Fprintf(w, "%-10s %-28s %9s %9s %8s %8s %9s %9s  %s\n", "target", "attack", "rss MB", "peak MB", "probes", "failed", "p50 ms", "max ms", "attackers let go / statuses")
	for _, r := range results {
		fmt.Fprintf(w, "%-10s %-28s %9.0f %9.0f %8d %8d %9.1f %9.1f  %d/%d %v\n", r.target, r.attack,
			float64(r.baseRSS)/(1<<20), float64(r.peakRSS)/(1<<20), r.probes, r.probeFailed,
			float64(r.p(0.5).Microseconds())/1000, float64(r.p(1).Microseconds())/1000, r.closed, r.attackers, r.statuses)
	}
}
