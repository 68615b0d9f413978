package ingest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/ingest"
	"github.com/deepseed/deepseed/store/storetest"
)

// Values PostgreSQL would refuse are refused at the door: a 400 naming the
// record's line and field, and nothing of the batch stored. Each of these
// once made the server answer 500, which a collector retries for ever.
func TestIngestRefusesWhatTheDatabaseWouldRefuse(t *testing.T) {
	s := newServer(t, ingest.Options{})
	good := `{"kind":"step","run_id":"p","rank":0,"step":1,"time":1000,"loss":1}`
	big := `{"kind":"run","run_id":"p","meta":{"notes":"` + strings.Repeat("x", 2<<20) + `"}}`
	cases := []struct {
		name, line, field string
	}{
		{"huge number in summary", `{"kind":"end","run_id":"p","status":"finished","summary":{"n":1e1000000}}`, "summary"},
		{"tiny number in summary", `{"kind":"end","run_id":"p","status":"finished","summary":{"n":1e-20000}}`, "summary"},
		{"huge number in config", `{"kind":"run","run_id":"p","config":{"lr":1e1000000}}`, "config"},
		{"NUL in a meta string", `{"kind":"run","run_id":"p","meta":{"gpu":"H100\u0000"}}`, "meta"},
		{"NUL in an extra meta string", `{"kind":"run","run_id":"p","meta":{"cluster":"a\u0000b"}}`, "meta.cluster"},
		{"NUL in a meta key", `{"kind":"run","run_id":"p","meta":{"a\u0000":1}}`, "meta"},
		{"NUL in a process run_id", `{"kind":"host","host":"n1","time":1000,"processes":[{"pid":1,"run_id":"r\u0000"}]}`, "processes[0].run_id"},
		{"NUL in a GPU process run_id", `{"kind":"gpu","host":"n1","gpu":0,"time":1000,"processes":[{"pid":1,"run_id":"r\u0000"}]}`, "processes[0].run_id"},
		{"lone surrogate in config", `{"kind":"run","run_id":"p","config":{"a":"\ud800"}}`, "config"},
		{"lone low surrogate in params", `{"kind":"run","run_id":"p","params":{"a":"x\udc00"}}`, "params"},
		{"lone surrogate in summary", `{"kind":"end","run_id":"p","status":"finished","summary":{"a":"\ud800x"}}`, "summary"},
		{"NUL in a config key", `{"kind":"run","run_id":"p","config":{"a\u0000":1}}`, "config"},
		{"meta over 1 MiB", big, "meta"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := s.stored(t)
			e := s.ingest(t, good, c.line).apiError(t, 400)
			if e.Record == nil || e.Record.Line != 2 || e.Record.Field != c.field {
				t.Fatalf("error %+v, record %+v: want line 2, field %q", e.Error, e.Record, c.field)
			}
			if after := s.stored(t); after != before {
				t.Fatalf("a refused batch changed the database: %d rows, then %d", before, after)
			}
		})
	}
	// What the database takes is taken: a surrogate pair, big numbers
	// within numeric's range.
	ok := s.ingest(t, `{"kind":"run","run_id":"p","config":{"emoji":"\ud83d\ude00","big":1e1000,"small":1e-1000}}`).result(t)
	if ok.Accepted != 1 {
		t.Fatalf("a run with a surrogate pair and large numbers: %+v", ok)
	}
}

// A value the validator lets through but the database refuses is still the
// sender's 400, naming the record, with nothing stored: here a CHECK the
// validator knows nothing of stands for whatever it may miss.
func TestIngestDatabaseRefusalIsA400(t *testing.T) {
	s := newServer(t, ingest.Options{})
	if _, err := storetest.Pool(t, s.Store).Exec(context.Background(), `ALTER TABLE runs ADD CONSTRAINT no_name_42 CHECK (name IS DISTINCT FROM 'forty-two')`); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for i := 0; i < 9; i++ {
		if i == 6 {
			lines = append(lines, `{"kind":"run","run_id":"chk","name":"forty-two"}`)
			continue
		}
		lines = append(lines, fmt.Sprintf(`{"kind":"step","run_id":"chk","rank":0,"step":%d,"time":1000,"loss":1.5}`, i))
	}
	before := s.stored(t)
	e := s.ingest(t, lines...).apiError(t, 400)
	if e.Record == nil || e.Record.Index != 6 || !strings.Contains(e.Error, "no_name_42") {
		t.Fatalf("error %q, record %+v: want record 6 named, with the database's reason", e.Error, e.Record)
	}
	if after := s.stored(t); after != before {
		t.Fatalf("a refused batch changed the database: %d rows, then %d", before, after)
	}
}

// A gzip body whose trailer understates its size (two members: the
// trailer counts only the last) is read whole when it fits, and refused
// with 413 when it does not, however little it declared.
func TestIngestGzipSizeNotTrusted(t *testing.T) {
	s := newServer(t, ingest.Options{MaxBodyBytes: 4 << 20})
	var big, small strings.Builder
	n := 0
	for ; big.Len() < 3<<20; n++ {
		fmt.Fprintf(&big, `{"kind":"step","run_id":"gz","rank":0,"step":%d,"time":1000,"loss":1.25,"lr":0.001}`+"\n", n)
	}
	fmt.Fprintf(&small, `{"kind":"step","run_id":"gz","rank":0,"step":%d,"time":1000}`+"\n", n)
	body := append(gz(t, []byte(big.String())), gz(t, []byte(small.String()))...)
	res := s.post(t, "/api/v1/ingest", body, "Content-Encoding", "gzip").result(t)
	if res.Accepted != n+1 {
		t.Fatalf("accepted %d of %d records", res.Accepted, n+1)
	}
	over := append(gz(t, []byte(big.String()+big.String())), gz(t, []byte(small.String()))...)
	before := s.stored(t)
	s.post(t, "/api/v1/ingest", over, "Content-Encoding", "gzip").apiError(t, 413)
	if after := s.stored(t); after != before {
		t.Fatalf("an oversized body changed the database")
	}
}
