package collector_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/collector"
	"github.com/deepseed/deepseed/internal/fuzztest"
	"github.com/deepseed/deepseed/internal/httplimit"
)

func gz(s string) string {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	w.Write([]byte(s))
	w.Close()
	return b.String()
}

// TestReceiverRejectsBadInput: bad hook requests get a clear 4xx and
// queue nothing.
func TestReceiverRejectsBadInput(t *testing.T) {
	c, err := collector.New(collector.Config{Server: "http://127.0.0.1:1", SpoolDir: t.TempDir(), HostName: "h", ProcRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	bomb := gz(strings.Repeat(" ", 33<<20))
	cases := []struct {
		name, method, path, enc, body string
		status                        int
		msg                           string
	}{
		{"malformed json", "POST", "/api/v1/ingest", "", `{"kind":"step",`, 400, "malformed JSON"},
		{"missing field", "POST", "/api/v1/ingest", "", `{"kind":"step","rank":0,"step":1}`, 400, "field run_id"},
		{"unknown kind", "POST", "/api/v1/ingest", "", `{"kind":"nope","run_id":"r"}`, 400, "kind"},
		{"second line bad", "POST", "/api/v1/ingest", "", "{\"kind\":\"step\",\"run_id\":\"r\",\"rank\":0,\"step\":1}\n{\"kind\":\"step\",\"run_id\":\"r\",\"rank\":-1,\"step\":2}", 400, "line 2"},
		{"bad pid", "POST", "/api/v1/ingest", "", `{"kind":"process","run_id":"r","rank":0,"local_rank":0,"pid":0}`, 400, "pid"},
		{"empty", "POST", "/api/v1/ingest", "", "", 400, "no records"},
		{"bad gzip", "POST", "/api/v1/ingest", "gzip", "not gzip", 400, "gzip"},
		{"unknown encoding", "POST", "/api/v1/ingest", "br", "x", 415, "Content-Encoding"},
		{"too large", "POST", "/api/v1/ingest", "gzip", bomb, 413, "larger than"},
		{"wrong method", "GET", "/api/v1/ingest", "", "", 405, "POST"},
		{"wrong path", "POST", "/ingest", "", "{}", 404, "/api/v1/ingest"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := post(t, c, tc.method, tc.path, tc.enc, tc.body)
			if code != tc.status || !strings.Contains(body, tc.msg) {
				t.Errorf("got %d %s, want %d mentioning %q", code, body, tc.status, tc.msg)
			}
		})
	}
	var buf bytes.Buffer
	c.WriteMetrics(&buf)
	for _, want := range []string{"deepseed_collector_queue_records 0\n", "deepseed_collector_hook_records_received_total 0\n"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("bad input changed the queue: /metrics lacks %q", want)
		}
	}
}

// TestReceiverAcceptsArrayNDJSONAndGzip: the three body forms the server
// takes are taken here too and queued record by record.
func TestReceiverAcceptsArrayNDJSONAndGzip(t *testing.T) {
	c, err := collector.New(collector.Config{Server: "http://127.0.0.1:1", SpoolDir: t.TempDir(), HostName: "h", ProcRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	step := `{"kind":"step","run_id":"r","rank":0,"step":1,"loss":NaN}`
	for _, tc := range []struct{ enc, body string }{
		{"", step + "\n\n" + step + "\n"},
		{"", "[" + step + ",\n " + step + "]"},
		{"gzip", gz(step + "\n" + step)},
	} {
		code, body := post(t, c, "POST", "/api/v1/ingest", tc.enc, tc.body)
		if code != 200 || !strings.Contains(body, `"accepted":2`) {
			t.Errorf("got %d %s, want 200 accepting 2", code, body)
		}
	}
	var buf bytes.Buffer
	c.WriteMetrics(&buf)
	if !strings.Contains(buf.String(), "deepseed_collector_queue_records 6\n") {
		t.Errorf("want 6 queued records:\n%s", buf.String())
	}
}

// BenchmarkHookReceive measures the receiver's work per 100-record post,
// its records synced to the spool before the answer, one post at a time
// ("sync") and from 16 senders at once ("sync-16", where group commit
// shares syncs), against the same without syncs ("nosync", "nosync-16").
// It reports the syncs per post.
func BenchmarkHookReceive(b *testing.B) {
	var body strings.Builder
	for k := 0; k < 100; k++ {
		body.WriteString(`{"kind":"step","run_id":"bench","rank":3,"step":1234,"time":1795328221.5,"loss":2.25,"lr":0.0003,"grad_norm":1.25,"loss_scale":65536,"samples":4096,"step_ms":412.5,"forward_ms":120.1,"backward_ms":250.3,"optimizer_ms":30.2,"comm_ms":11.9,"throughput_sps":77.6,"gpu_util_pct":97,"gpu_mem_used_gb":61.2}` + "\n")
	}
	s := body.String()
	for _, sync := range []bool{true, false} {
		for _, senders := range []int{1, 16} {
			name := map[bool]string{true: "sync", false: "nosync"}[sync]
			if senders > 1 {
				name += fmt.Sprintf("-%d", senders)
			}
			b.Run(name, func(b *testing.B) {
				defer collector.SetNoSync(!sync)()
				c, err := collector.New(collector.Config{Server: "http://127.0.0.1:1", SpoolDir: b.TempDir(), HostName: "h", ProcRoot: b.TempDir()})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.SetParallelism(senders)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						req := httptest.NewRequest("POST", "/api/v1/ingest", strings.NewReader(s))
						rec := httptest.NewRecorder()
						c.ServeHTTP(rec, req)
						if rec.Code != 200 {
							b.Errorf("status %d: %s", rec.Code, rec.Body)
						}
					}
				})
				b.ReportMetric(float64(collector.SpoolWrites(c))/float64(b.N), "syncs/op")
			})
		}
	}
}

// Mutated hook bodies (every record kind the hook sends) get a 2xx or a
// 4xx from the collector's receiver, never a 5xx or a panic.
func TestReceiverMutatedBodiesNever5xx(t *testing.T) {
	c, err := collector.New(collector.Config{Server: "http://127.0.0.1:1", SpoolDir: t.TempDir(), HostName: "h", ProcRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	bases := []string{
		`{"kind":"run","run_id":"fz","project":"p","name":"n","meta":{"world_size":2,"host":"h"},"config":{"lr":0.1}}
{"kind":"process","run_id":"fz","rank":0,"local_rank":0,"pid":1234}
{"kind":"step","run_id":"fz","rank":0,"step":1,"time":1000.5,"loss":2.5,"step_ms":41.25,"sync_ns":1000500000000,"metrics":{"pipeline_stage":0}}`,
		`{"kind":"layers","run_id":"fz","rank":0,"step":10,"time":1000,"names":["a","b"],"forward_ms":[1,2],"backward_ms":[2,4]}
{"kind":"eval","run_id":"fz","step":10,"time":1001,"loss":1,"accuracy":0.5}
{"kind":"memory","run_id":"fz","rank":0,"time":1001,"parameters_bytes":1,"gradients_bytes":2,"optimizer_bytes":3}`,
		`[{"kind":"event","run_id":"fz","time":1002,"type":"overflow","text":"skipped","step":3},{"kind":"end","run_id":"fz","time":1003,"status":"finished"}]`,
	}
	rng := rand.New(rand.NewPCG(23, 5))
	statuses := map[int]int{}
	for i := 0; i < 1500; i++ {
		body := []byte(bases[rng.IntN(len(bases))])
		body = fuzztest.MutateSome(rng, body)
		code, answer := post(t, c, "POST", "/api/v1/ingest", "", string(body))
		statuses[code]++
		if code >= 500 {
			t.Errorf("try %d: %d %s for %.300q", i, code, answer, body)
		}
	}
	t.Logf("1500 mutated hook bodies: answers %v", statuses)
}

// TestReceiverRowsCap: the hook receiver, which needs no token, bounds the
// rows a body expands to as the server does: steps records past
// --max-batch-rows get 413 naming it, and nothing reaches the spool.
func TestReceiverRowsCap(t *testing.T) {
	dir := t.TempDir()
	c, err := collector.New(collector.Config{Server: "http://127.0.0.1:1", SpoolDir: dir, HostName: "h", ProcRoot: t.TempDir(),
		HTTP: httplimit.Limits{MaxBatchRows: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	steps := make([]string, 600)
	for i := range steps {
		steps[i] = fmt.Sprint(i)
	}
	line := `{"kind":"steps","run_id":"r","rank":0,"lr":0.1,"step":[` + strings.Join(steps, ",") + "]}\n"
	code, body := post(t, c, "POST", "/api/v1/ingest", "", line+line)
	if code != 413 || !strings.Contains(body, "1000 rows") || !strings.Contains(body, "--max-batch-rows") {
		t.Fatalf("got %d %s, want 413 naming the cap and its flag", code, body)
	}
	if files, _ := os.ReadDir(dir); len(spoolFiles(files)) != 0 {
		t.Fatalf("a refused body left %d spool files", len(spoolFiles(files)))
	}
	if code, body := post(t, c, "POST", "/api/v1/ingest", "", line); code != 200 {
		t.Fatalf("one record within the cap: %d %s", code, body)
	}
	if files, _ := os.ReadDir(dir); len(spoolFiles(files)) != 1 {
		t.Fatalf("the accepted body left %d spool files, want 1", len(spoolFiles(files)))
	}
}

func spoolFiles(entries []os.DirEntry) []string {
	var out []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".ndjson") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestReceiverLargeBodyCheckedWhole: a large NDJSON body is checked a line
// at a time, and nothing of it is acted on before its last line is: with
// that line bad it is refused naming the line, its process announcement is
// not kept and nothing reaches the spool; valid, every record is queued.
func TestReceiverLargeBodyCheckedWhole(t *testing.T) {
	dir := t.TempDir()
	c, err := collector.New(collector.Config{Server: "http://127.0.0.1:1", SpoolDir: dir, HostName: "h", ProcRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString(`{"kind":"process","run_id":"big","rank":0,"local_rank":0,"pid":4242}` + "\n")
	steps := 0
	for ; b.Len() < 3*httplimit.StreamChunkBytes; steps++ {
		fmt.Fprintf(&b, `{"kind":"step","run_id":"big","rank":0,"step":%d,"loss":1.5,"metrics":{"metric_a":1,"metric_b":2,"metric_c":3,"metric_d":4,"metric_e":5,"metric_f":6}}`+"\n", steps)
	}
	valid := b.String()
	bad := valid + `{"kind":"step","run_id":"big","rank":-1,"step":1}` + "\n"
	code, body := post(t, c, "POST", "/api/v1/ingest", "", bad)
	if want := fmt.Sprintf("line %d", steps+2); code != 400 || !strings.Contains(body, want) {
		t.Fatalf("got %d %s, want 400 naming %s", code, body, want)
	}
	if n := collector.Announced(c); n != 0 {
		t.Fatalf("a refused body announced %d processes", n)
	}
	if files, _ := os.ReadDir(dir); len(spoolFiles(files)) != 0 {
		t.Fatalf("a refused body left %d spool files", len(spoolFiles(files)))
	}
	code, body = post(t, c, "POST", "/api/v1/ingest", "", valid)
	if want := fmt.Sprintf(`"accepted":%d`, steps+1); code != 200 || !strings.Contains(body, want) {
		t.Fatalf("got %d %s, want 200 accepting %d", code, body, steps+1)
	}
	if n := collector.Announced(c); n != 1 {
		t.Fatalf("the body announced %d processes, want 1", n)
	}
	var m bytes.Buffer
	c.WriteMetrics(&m)
	if want := fmt.Sprintf("deepseed_collector_queue_records %d\n", steps); !strings.Contains(m.String(), want) {
		t.Errorf("want %d queued records:\n%s", steps, m.String())
	}
	if used, _ := httplimit.InflightBytes(); used != 0 {
		t.Fatalf("%d bytes still leased after every answer", used)
	}
}
