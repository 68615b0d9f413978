package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The attacks of valid bodies sent in full: one client posting a real
// 32 MiB NDJSON body (what one body costs), 40 clients each posting one
// at 1 MiB/s, and 4 clients each posting ten
// steps records of 10⁵ steps (6.6 MB that expand to a million rows). No
// single body is past a bound; together they are what the process's
// memory budget and the rows bound are for.
const (
	fullClients    = 40
	fullBodyBytes  = 32 << 20
	fullBodyRate   = 1 << 20 // bytes a second, each client
	rowsClients    = 4
	rowsRecords    = 10
	rowsStepsEach  = 100000
	fullBodyWindow = 3 * time.Minute
)

// fullBody is an NDJSON body of about size bytes of valid step records,
// each carrying metrics so that a record is about a kilobyte.
func fullBody(run string, size int) []byte {
	var metrics strings.Builder
	for i := range 40 {
		fmt.Fprintf(&metrics, `,"metric_%02d":%d.5`, i, i)
	}
	var b bytes.Buffer
	b.Grow(size)
	for step := 0; ; step++ {
		line := fmt.Sprintf(`{"kind":"step","run_id":"%s","rank":0,"step":%d,"time":%d,"loss":1.5,"metrics":{%s}}`+"\n",
			run, step, 1700000000+step, metrics.String()[1:])
		if b.Len()+len(line) > size {
			return b.Bytes()
		}
		b.WriteString(line)
	}
}

// rowsBody is records steps records of steps steps each.
func rowsBody(run string, records, steps int) []byte {
	var b bytes.Buffer
	for r := range records {
		fmt.Fprintf(&b, `{"kind":"steps","run_id":"%s","rank":%d,"loss":1.5,"step":[`, run, r)
		for s := range steps {
			if s > 0 {
				b.WriteByte(',')
			}
			fmt.Fprint(&b, s)
		}
		b.WriteString("]}\n")
	}
	return b.Bytes()
}

// pacedReader gives out its bytes at rate bytes a second.
type pacedReader struct {
	r     io.Reader
	rate  int
	start time.Time
	sent  int
}

func (p *pacedReader) Read(b []byte) (int, error) {
	if p.start.IsZero() {
		p.start = time.Now()
	}
	if ahead := time.Duration(float64(p.sent)/float64(p.rate)*float64(time.Second)) - time.Since(p.start); ahead > 0 {
		time.Sleep(ahead)
	}
	n, err := p.r.Read(b[:min(len(b), p.rate/16)])
	p.sent += n
	return n, err
}

// posting is an attack of whole ingest bodies: clients posting body at
// once, rounds times over.
type posting struct {
	clients, rounds int
	body            []byte
	rate            int  // bytes a second, each client; 0: as fast as the connection takes it
	gzip            bool // body is gzip-encoded
	timeout         time.Duration
	// closedLetGo counts a client whose connection the target closed
	// without an answer as let go, as well as one answered.
	closedLetGo bool
}

// postBodies runs p against t and counts the answers by status (0: no
// answer).
func postBodies(t attackTarget, p posting) func(ctx context.Context) (int, int, map[int]int) {
	return func(ctx context.Context) (int, int, map[int]int) {
		var mu sync.Mutex
		letGo := 0
		statuses := map[int]int{}
		client := &http.Client{Timeout: p.timeout}
		for range p.rounds {
			var wg sync.WaitGroup
			for range p.clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var r io.Reader = bytes.NewReader(p.body)
					if p.rate > 0 {
						r = &pacedReader{r: r, rate: p.rate}
					}
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+t.addr+"/api/v1/ingest", r)
					req.ContentLength = int64(len(p.body))
					if p.gzip {
						req.Header.Set("Content-Encoding", "gzip")
					}
					req.Header.Set("Content-Type", "application/x-ndjson")
					if t.token != "" {
						req.Header.Set("Authorization", "Bearer "+t.token)
					}
					resp, err := client.Do(req)
					status := 0
					if err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						status = resp.StatusCode
					}
					mu.Lock()
					statuses[status]++
					if err == nil || p.closedLetGo {
						letGo++
					}
					mu.Unlock()
				}()
			}
			wg.Wait()
		}
		return p.clients * p.rounds, letGo, statuses
	}
}

// attackBodies runs the attacks of valid bodies on t in turn.
func attackBodies(ctx context.Context, t attackTarget, run string) []*attackResult {
	full := fullBody(run+"-full", fullBodyBytes)
	rows := rowsBody(run+"-rows", rowsRecords, rowsStepsEach)
	return []*attackResult{
		runAttack(ctx, t, "1 full 32 MiB body", postBodies(t, posting{
			clients: 1, rounds: 1, body: full, timeout: fullBodyWindow, closedLetGo: true})),
		runAttack(ctx, t, fmt.Sprintf("%d full 32 MiB bodies, 1 MiB/s", fullClients), postBodies(t, posting{
			clients: fullClients, rounds: 1, body: full, rate: fullBodyRate, timeout: fullBodyWindow, closedLetGo: true})),
		runAttack(ctx, t, fmt.Sprintf("%d×%d steps records of 10⁵", rowsClients, rowsRecords), postBodies(t, posting{
			clients: rowsClients, rounds: 1, body: rows, timeout: fullBodyWindow, closedLetGo: true})),
	}
}
