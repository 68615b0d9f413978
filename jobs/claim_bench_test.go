package jobs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// BenchmarkClaim queues 10,000 one-GPU jobs and lets 50 agents claim them
// concurrently through the HTTP API, one free GPU per claim, until the
// queue is empty. It reports the p50 and p99 claim latency and fails if a
// job is handed out twice or not at all.
//
//	go test ./jobs/ -run '^$' -bench Claim -benchtime 1x
func BenchmarkClaim(b *testing.B) {
	const jobs, agents = 10000, 50
	e := startWith(b, time.Hour) // no heartbeats here: keep the reaper off them
	ctx := context.Background()
	tr := &http.Transport{MaxIdleConnsPerHost: agents}
	client := &http.Client{Transport: tr}
	var all []time.Duration
	for n := 0; n < b.N; n++ {
		b.StopTimer()
		if _, err := storetest.Pool(b, e.st).Exec(ctx, `TRUNCATE jobs`); err != nil {
			b.Fatal(err)
		}
		batch := make([]store.NewJob, jobs)
		for i := range batch {
			batch[i] = store.NewJob{Project: fmt.Sprintf("p%d", i%5), Argv: []string{"true"}, GPUs: 1}
		}
		if _, err := e.st.CreateJobs(ctx, batch, nil); err != nil {
			b.Fatal(err)
		}
		body, _ := json.Marshal(api.AgentClaim{FreeGPUs: []int{0}, Executor: "local"})
		var mu sync.Mutex
		var lat []time.Duration
		got := make([]int64, 0, jobs)
		var wg sync.WaitGroup
		b.StartTimer()
		for a := 0; a < agents; a++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					req, _ := http.NewRequest("POST", fmt.Sprintf("%s/api/v1/agents/a%d/claim", e.url, a), bytes.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+agentTok)
					t0 := time.Now()
					res, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					var r api.AgentClaimReply
					err = json.NewDecoder(res.Body).Decode(&r)
					res.Body.Close()
					d := time.Since(t0)
					if err != nil || res.StatusCode != 200 {
						b.Errorf("claim: %d %v", res.StatusCode, err)
						return
					}
					mu.Lock()
					lat = append(lat, d)
					if r.Job != nil {
						got = append(got, r.Job.ID)
					}
					mu.Unlock()
					if r.Job == nil {
						return
					}
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		slices.Sort(got)
		if len(slices.Compact(slices.Clone(got))) != len(got) || len(got) != jobs {
			b.Fatalf("%d claims of %d distinct jobs, want %d each", len(got), len(slices.Compact(got)), jobs)
		}
		var running, agentsSeen int
		if err := storetest.Pool(b, e.st).QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'running'), count(DISTINCT agent) FROM jobs`).Scan(&running, &agentsSeen); err != nil {
			b.Fatal(err)
		}
		if running != jobs || agentsSeen != agents {
			b.Fatalf("%d jobs running on %d agents, want %d on %d", running, agentsSeen, jobs, agents)
		}
		all = append(all, lat...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	q := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(float64(len(all))/float64(b.N), "claims/op")
}
