package server

import (
	"net/url"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/store/storetest"
)

// hostileValues are query values a client, a fuzzer or an attacker may
// send; none may get a 5xx.
var hostileValues = []string{
	"%00", "a%00b", "%ff%fe", "%c3%28", "%ed%a0%80", "'; DROP TABLE runs; --", "\" OR 1=1 --",
	"-1", "0", "NaN", "Infinity", "-Infinity", "1e309", "99999999999999999999999999", "-99999999999999999999",
	"9223372036854775808", "1.5", "", "%20", strings.Repeat("x", 300), strings.Repeat("y", 9000),
	"2025-13-45T99:99:99Z", "now-7d", "true", "null", "[]", "{}", "%5B%5D", "loss,%00",
}

// Every GET route answers hostile path ids and query parameters with a 4xx
// (or, where the value is merely unusual, a 2xx), never a 5xx; NUL bytes
// and invalid UTF-8 are a 400 that names the parameter.
func TestHostileGETParametersNever5xx(t *testing.T) {
	st := storetest.NewStore(t)
	srv := New(testConfig(), st, testLogger(t))
	r := start(t, srv)
	waitFor(t, "ready", func() bool { code, _, _ := do(t, "GET", r.url+"/readyz", "", ""); return code == 200 })

	params := []string{"project", "tag", "run", "runs", "metric", "metrics", "rank", "max_points", "from", "to",
		"split", "width", "host", "baseline", "limit", "status", "sweep", "step_from", "step_to", "sort", "q",
		"run_id", "state", "kind", "type", "agent", "goal", "pass", "straggler_pct", "from_step", "to_step",
		"max_steps", "offset", "gpu"}
	var paths []string
	for _, rt := range srv.Routes() {
		if rt.Method != "GET" || !strings.HasPrefix(rt.Path, APIPrefix) {
			continue
		}
		paths = append(paths, rt.Path)
	}
	if len(paths) < 8 {
		t.Fatalf("only %d GET routes found: %v", len(paths), paths)
	}
	tries, sent := 0, 0
	for _, p := range paths {
		for _, id := range []string{"a%00b", "%ff%fe", "x'--", strings.Repeat("r", 400)} {
			u := r.url + strings.ReplaceAll(strings.ReplaceAll(p, ":id", id), ":host", id)
			for _, name := range params {
				for _, v := range hostileValues {
					if tries%7 != 0 && strings.Contains(u, "%") { // keep the count bounded
						tries++
						continue
					}
					tries++
					sent++
					code, body, _ := do(t, "GET", u+"?"+name+"="+v, "", "")
					if code >= 500 {
						t.Errorf("GET %s?%s=%s: %d %s", u, name, v, code, body)
					}
				}
			}
			// Unknown ids of plain text get a 4xx too, never a 5xx.
			code, body, _ := do(t, "GET", u, "", "")
			if code >= 500 {
				t.Errorf("GET %s: %d %s", u, code, body)
			}
		}
	}
	t.Logf("%d hostile requests over %d GET routes", sent, len(paths))

	for _, c := range []struct{ path, want string }{
		{APIPrefix + "/runs?project=%00", "project"},
		{APIPrefix + "/runs?tag=%ff%fe", "tag"},
		{APIPrefix + "/runs/a%00b", "path"},
		{APIPrefix + "/runs/x/series?metric=" + url.QueryEscape(strings.Repeat("m", 9000)), "metric"},
	} {
		code, body, _ := do(t, "GET", r.url+c.path, "", "")
		if code != 400 || !strings.Contains(string(body), c.want) {
			t.Errorf("GET %s: %d %s, want 400 naming %s", c.path, code, body, c.want)
		}
	}
}
