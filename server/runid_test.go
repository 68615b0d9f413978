package server

import (
	"encoding/json"
	"net/url"
	"testing"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store/storetest"
)

// A run id is any text (no NUL, at most api.MaxIDLen bytes): one holding
// "/", "%", "?" or spaces is stored as written and read back through its
// percent-encoded path.
func TestRunIDsReadBackHoweverWritten(t *testing.T) {
	r := start(t, New(testConfig(), storetest.NewStore(t), testLogger(t)))
	waitFor(t, "readyz", func() bool { code, _, _ := do(t, "GET", r.url+"/readyz", "", ""); return code == 200 })
	for _, id := range []string{"team/exp-1", "a%2Fb", "lr 2e-5?batch=8#1", "../runs", "ü/ß", "plain"} {
		body := `{"kind":"run","run_id":` + quote(id) + `,"project":"ids","name":"n"}` + "\n" +
			`{"kind":"step","run_id":` + quote(id) + `,"rank":0,"step":1,"loss":0.5}` + "\n"
		if code, b, _ := do(t, "POST", r.url+"/api/v1/ingest", "", body); code != 200 {
			t.Fatalf("ingest run %q: %d %s", id, code, b)
		}
		path := r.url + "/api/v1/runs/" + url.PathEscape(id)
		code, b, _ := do(t, "GET", path, "", "")
		var d api.RunDetail
		if code != 200 || json.Unmarshal(b, &d) != nil || d.RunID != id {
			t.Errorf("GET %s = %d %s; want run %q", path, code, b, id)
			continue
		}
		code, b, _ = do(t, "GET", path+"/series?metric=loss", "", "")
		var s api.SeriesResponse
		if code != 200 || json.Unmarshal(b, &s) != nil || len(s.Series) != 1 || len(s.Series[0].Points) != 1 {
			t.Errorf("GET %s/series = %d %s; want its one loss point", path, code, b)
		}
	}
	// Unescaped, "team/exp-1" is another path: no run, not another run's data.
	if code, _, _ := do(t, "GET", r.url+"/api/v1/runs/team/exp-1", "", ""); code != 404 {
		t.Errorf("GET /runs/team/exp-1 = %d, want 404", code)
	}
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
