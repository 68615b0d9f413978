package plugin

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// runDetailsQuery is a run's key/value table, from GET /runs/{id}.
var runDetailsQuery = get[api.RunDetail]{
	path:   runPathOf(""),
	frames: func(_ request, rd api.RunDetail) data.Frames { return data.Frames{runDetailsFrame(rd)} },
}

// kv is one row of the run-details table.
type kv struct{ section, key, value string }

// runDetailsFrame is the seed's "training notebook" as key/value rows:
// identity, command, git commit, versions, then hyper-parameters, config
// and meta flattened to dotted keys.
func runDetailsFrame(d api.RunDetail) *data.Frame {
	rows := []kv{
		{"run", "run_id", d.RunID},
		{"run", "name", d.Name},
		{"run", "project", d.Project},
		{"run", "status", d.Status},
		{"run", "host", d.Host},
		{"run", "command", d.Command},
		{"run", "git_commit", d.GitCommit},
	}
	if d.StartedAt != nil {
		rows = append(rows, kv{"run", "started_at", d.StartedAt.UTC().Format(time.RFC3339)})
	}
	if len(d.Ranks) > 0 {
		r := make([]string, len(d.Ranks))
		for i, n := range d.Ranks {
			r[i] = strconv.Itoa(n)
		}
		rows = append(rows, kv{"run", "ranks", strings.Join(r, ", ")})
	}
	for _, k := range slices.Sorted(maps.Keys(d.Versions)) {
		rows = append(rows, kv{"versions", k, d.Versions[k]})
	}
	rows = flattenJSON(rows, "params", "", d.Params)
	rows = flattenJSON(rows, "config", "", d.Config)
	rows = flattenJSON(rows, "meta", "", d.Meta)
	rows = flattenJSON(rows, "summary", "", d.Summary)
	return data.NewFrame("run_details",
		strCol(rows, "section", "Section", func(r kv) string { return r.section }),
		strCol(rows, "key", "Key", func(r kv) string { return r.key }),
		strCol(rows, "value", "Value", func(r kv) string { return r.value }),
	)
}

// flattenJSON appends one row per leaf of raw, objects flattened to dotted
// keys in sorted order; arrays stay as compact JSON, as people write them.
func flattenJSON(rows []kv, section, prefix string, raw json.RawMessage) []kv {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return rows
	}
	if raw[0] == '{' {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err == nil {
			for _, k := range slices.Sorted(maps.Keys(obj)) {
				key := k
				if prefix != "" {
					key = prefix + "." + k
				}
				rows = flattenJSON(rows, section, key, obj[k])
			}
			return rows
		}
	}
	value := string(raw)
	var s string
	if raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
		value = s
	} else {
		var buf bytes.Buffer
		if json.Compact(&buf, raw) == nil {
			value = buf.String()
		}
	}
	if prefix == "" {
		prefix = section
	}
	return append(rows, kv{section, prefix, value})
}
