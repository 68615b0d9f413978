package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/store"
)

const perRankNotes = `
With --per-rank the tool plays one run of --ranks ranks in which every rank
is its own sender, as when each training process posts straight to the
server: each rank posts one batch of --rate step records every second, on
its own kept-alive connection, starting spread over the first second, for
--duration. It reports the records offered and accepted per second, the
request latency (p50, p99, max) and the answers other than 200; with
--database-url it then counts the run's stored steps and any step stored
twice. A rank whose previous request has not been answered when its next
second comes skips that second: the skipped records count as offered, not
sent.`

// perRankBench is the many-ranks load: one run, one sender per rank.
type perRankBench struct {
	target, token string
	ranks, rate   int
	duration      time.Duration
	runID         string
	start         time.Time
}

// perRankResult is what the senders saw.
type perRankResult struct {
	offered, sent, accepted, duplicates int64
	statuses                            map[int]int64
	transport                           int64
	latencies                           []time.Duration
	elapsed                             time.Duration
}

// bodies encodes every request of every rank before the clock starts.
func (c perRankBench) bodies() ([][][]byte, error) {
	seconds := int(c.duration / time.Second)
	out := make([][][]byte, c.ranks)
	for r := range out {
		out[r] = make([][]byte, seconds)
		for s := 0; s < seconds; s++ {
			recs := make([]api.Record, c.rate)
			for i := range recs {
				step := int64(s*c.rate + i)
				t := api.T(c.start.Add(time.Duration(step) * 100 * time.Millisecond))
				recs[i] = api.Record{Step: &api.Step{Kind: api.KindStep, RunID: c.runID, Rank: r, Step: &step, Time: t,
					Loss: api.F(2.5 - float64(step)/1e4), LR: api.F(2e-5), GradNorm: api.F(0.7), StepMS: api.F(98.5),
					ForwardMS: api.F(30.1), BackwardMS: api.F(55.2), OptimizerMS: api.F(10.3), DataMS: api.F(2.9)}}
			}
			body, err := ingest.EncodeNDJSON(recs, true)
			if err != nil {
				return nil, err
			}
			out[r][s] = body
		}
	}
	return out, nil
}

func (c perRankBench) run(ctx context.Context) (perRankResult, error) {
	bodies, err := c.bodies()
	if err != nil {
		return perRankResult{}, err
	}
	res := perRankResult{statuses: map[int]int64{}}
	var mu sync.Mutex
	var sent, accepted, dups, transport atomic.Int64
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConns: c.ranks, MaxIdleConnsPerHost: c.ranks, IdleConnTimeout: time.Minute}}
	defer client.CloseIdleConnections()
	seconds := len(bodies[0])
	res.offered = int64(c.ranks * seconds * c.rate)
	begin := time.Now()
	var wg sync.WaitGroup
	for r := 0; r < c.ranks; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Ranks start spread over the first second, as real ones drift.
			offset := time.Duration(r) * time.Second / time.Duration(c.ranks)
			for s := 0; s < seconds; s++ {
				due := begin.Add(offset + time.Duration(s)*time.Second)
				if d := time.Until(due); d > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(d):
					}
				} else if d < -time.Second {
					continue // this second's request is a whole second late: skipped
				}
				t0 := time.Now()
				status, ir, err := c.post(ctx, client, bodies[r][s])
				lat := time.Since(t0)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					transport.Add(1)
					continue
				}
				sent.Add(int64(c.rate))
				mu.Lock()
				res.latencies = append(res.latencies, lat)
				res.statuses[status]++
				mu.Unlock()
				if status == http.StatusOK {
					accepted.Add(int64(ir.Accepted))
					dups.Add(int64(ir.Duplicates))
				}
			}
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(begin)
	res.sent, res.accepted, res.duplicates, res.transport = sent.Load(), accepted.Load(), dups.Load(), transport.Load()
	return res, ctx.Err()
}

func (c perRankBench) post(ctx context.Context, client *http.Client, body []byte) (int, api.IngestResult, error) {
	var ir api.IngestResult
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.target, bytes.NewReader(body))
	if err != nil {
		return 0, ir, err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("Content-Encoding", "gzip")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, ir, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, ir, err
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &ir); err != nil {
			return 0, ir, fmt.Errorf("server answered 200 with %q: %w", b, err)
		}
	}
	return resp.StatusCode, ir, nil
}

// quantile returns the q-quantile of sorted durations (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// report prints the result and, given the database, what was stored. It
// fails when records were refused, lost or stored twice.
func (c perRankBench) report(ctx context.Context, res perRankResult, st *store.Store) error {
	secs := res.elapsed.Seconds()
	sort.Slice(res.latencies, func(i, j int) bool { return res.latencies[i] < res.latencies[j] })
	fmt.Printf("per-rank ingest: %d ranks of one run, %d step records a second each, %.1fs\n", c.ranks, c.rate, secs)
	fmt.Printf("offered:   %d records = %.0f records/s\n", res.offered, float64(res.offered)/secs)
	fmt.Printf("sent:      %d records = %.0f records/s (%.1f %% of offered)\n", res.sent, float64(res.sent)/secs, 100*float64(res.sent)/float64(max(res.offered, 1)))
	fmt.Printf("accepted:  %d records = %.0f records/s, %d duplicates\n", res.accepted, float64(res.accepted)/secs, res.duplicates)
	fmt.Printf("latency:   p50 %s, p99 %s, max %s over %d requests\n", quantile(res.latencies, 0.5).Round(time.Millisecond),
		quantile(res.latencies, 0.99).Round(time.Millisecond), quantile(res.latencies, 1).Round(time.Millisecond), len(res.latencies))
	var problems []error
	for status, n := range res.statuses {
		if status != http.StatusOK {
			fmt.Printf("answers:   %d × HTTP %d\n", n, status)
			problems = append(problems, fmt.Errorf("%d requests answered %d", n, status))
		}
	}
	if res.transport > 0 {
		fmt.Printf("answers:   %d requests failed without an answer\n", res.transport)
		problems = append(problems, fmt.Errorf("%d requests failed without an answer", res.transport))
	}
	if st != nil {
		stored, twice, err := st.CountStepRows(ctx, c.runID, false)
		if err != nil {
			return fmt.Errorf("count stored steps: %w", err)
		}
		fmt.Printf("stored:    %d steps, %d stored twice\n", stored, twice)
		if stored != res.accepted {
			problems = append(problems, fmt.Errorf("%d steps stored for %d accepted", stored, res.accepted))
		}
		if twice > 0 {
			problems = append(problems, fmt.Errorf("%d steps stored twice", twice))
		}
	}
	return errors.Join(problems...)
}

// runPerRank runs the per-rank load and reports it.
func runPerRank(ctx context.Context, c perRankBench, st *store.Store) error {
	fmt.Fprintf(os.Stderr, "encoding %d requests of %d records for %d ranks…\n", c.ranks*int(c.duration/time.Second), c.rate, c.ranks)
	res, err := c.run(ctx)
	if err != nil {
		return fmt.Errorf("bench ingest: per-rank: %w", err)
	}
	if err := c.report(ctx, res, st); err != nil {
		return fmt.Errorf("bench ingest: per-rank: %w", err)
	}
	return nil
}
