package plugin

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/deepseed/deepseed/api"
)

// QueryError is a query the backend refuses, naming the field at fault.
type QueryError struct {
	Field string // JSON name in the query model, e.g. "runId"
	Msg   string
}

func (e *QueryError) Error() string {
	if e.Field == "" {
		return "query: " + e.Msg
	}
	return fmt.Sprintf("query: %s: %s", e.Field, e.Msg)
}

// stepMetrics are the step values the query service serves as series
// (the step table's, api.StepFields, but what it only stores), with the
// per-rank series it computes across the ranks of each step (lateness_ms,
// straggler_score); user metrics are named metrics.NAME.
var stepMetrics = func() []string {
	var out []string
	for _, sf := range api.StepFields {
		if sf.Sum != api.StepStored {
			out = append(out, sf.Name)
		}
	}
	return append(out, "lateness_ms", "straggler_score")
}()

// hasVariable reports whether s still holds a Grafana template variable
// ($run, ${run}, [[run]]). Provisioned dashboards store queries before
// interpolation, so such values are accepted as they are.
func hasVariable(s string) bool { return strings.Contains(s, "$") || strings.Contains(s, "[[") }

// ParseQuery decodes and checks one query of the data source's JSON query
// model ([api.PluginQuery]). Fields Grafana adds to every query (refId,
// datasource, intervalMs, …) are ignored. Values that still hold template
// variables pass as they are: Grafana replaces them before the backend
// runs a query, and the query service checks the result.
func ParseQuery(raw json.RawMessage) (api.PluginQuery, error) {
	var q api.PluginQuery
	if len(raw) == 0 {
		return q, &QueryError{Msg: "empty query"}
	}
	if err := json.Unmarshal(raw, &q); err != nil {
		return q, &QueryError{Msg: "not a DeepSeed query: " + err.Error()}
	}
	if q.QueryType == "" {
		return q, &QueryError{Field: "queryType", Msg: "missing; want one of " + strings.Join(api.PluginQueryTypes, ", ")}
	}
	if !slices.Contains(api.PluginQueryTypes, q.QueryType) {
		return q, &QueryError{Field: "queryType", Msg: fmt.Sprintf("unknown %q; want one of %s", q.QueryType, strings.Join(api.PluginQueryTypes, ", "))}
	}
	if queryTypes[q.QueryType].needsRun && strings.TrimSpace(q.RunID) == "" {
		return q, &QueryError{Field: "runId", Msg: "a run is required for " + q.QueryType}
	}
	if q.QueryType == api.QueryCompare && len(q.RunIDs) == 0 && q.Sweep == "" && q.Project == "" && q.RunID == "" {
		return q, &QueryError{Field: "runIds", Msg: "compare needs runs, a sweep or a project"}
	}
	if q.QueryType == api.QuerySeries && len(q.Metrics) == 0 {
		return q, &QueryError{Field: "metrics", Msg: "pick at least one metric"}
	}
	if q.QueryType == api.QuerySeries {
		for _, m := range q.Metrics {
			if !validMetric(m) {
				return q, &QueryError{Field: "metrics", Msg: fmt.Sprintf("unknown metric %q; want %s or metrics.NAME", m, strings.Join(stepMetrics, ", "))}
			}
		}
	}
	if r := q.Rank; r != "" && r != "all" && !hasVariable(r) {
		if n, err := strconv.Atoi(r); err != nil || n < 0 {
			return q, &QueryError{Field: "rank", Msg: fmt.Sprintf("%q: want a rank number or all", r)}
		}
	}
	switch q.XAxis {
	case "", "time", "step":
	default:
		return q, &QueryError{Field: "xAxis", Msg: fmt.Sprintf("%q: want time or step", q.XAxis)}
	}
	switch q.Pass {
	case "", "forward", "backward":
	default:
		if !hasVariable(q.Pass) {
			return q, &QueryError{Field: "pass", Msg: fmt.Sprintf("%q: want forward or backward", q.Pass)}
		}
	}
	switch q.Format {
	case "":
	case api.FormatNumeric:
		if q.QueryType != api.QueryRunSummary && q.QueryType != api.QueryRanks && q.QueryType != api.QueryAlerts {
			return q, &QueryError{Field: "format", Msg: "numeric is for run_summary, ranks and alerts"}
		}
	case api.FormatTable:
		if q.QueryType != api.QueryGPUs {
			return q, &QueryError{Field: "format", Msg: "table is for gpus"}
		}
	default:
		return q, &QueryError{Field: "format", Msg: fmt.Sprintf("%q: want numeric, table or nothing", q.Format)}
	}
	switch q.Part {
	case api.PartRanks:
	case api.PartHosts:
		if q.QueryType != api.QueryRanks {
			return q, &QueryError{Field: "part", Msg: "hosts is for ranks"}
		}
		if q.Format != "" {
			return q, &QueryError{Field: "part", Msg: "hosts has no numeric format"}
		}
	case api.PartBars:
		if q.QueryType != api.QueryRanks || q.Format != "" {
			return q, &QueryError{Field: "part", Msg: "bars is for ranks, with no format"}
		}
		if len(q.Metrics) != 1 || !slices.Contains(RankBarFigures, q.Metrics[0]) {
			return q, &QueryError{Field: "metrics", Msg: fmt.Sprintf("bars: want one of %s", strings.Join(RankBarFigures, ", "))}
		}
	default:
		return q, &QueryError{Field: "part", Msg: fmt.Sprintf("%q: want hosts, bars or nothing", q.Part)}
	}
	if q.MaxSteps < 0 {
		return q, &QueryError{Field: "maxSteps", Msg: "must not be negative"}
	}
	if q.FromStep != nil && *q.FromStep < 0 {
		return q, &QueryError{Field: "fromStep", Msg: "must not be negative"}
	}
	if q.ToStep != nil && *q.ToStep < 0 {
		return q, &QueryError{Field: "toStep", Msg: "must not be negative"}
	}
	if q.FromStep != nil && q.ToStep != nil && *q.FromStep > *q.ToStep {
		return q, &QueryError{Field: "toStep", Msg: "must not be before fromStep"}
	}
	if g := q.GPU; g != "" && !hasVariable(g) {
		if n, err := strconv.Atoi(g); err != nil || n < 0 {
			return q, &QueryError{Field: "gpu", Msg: fmt.Sprintf("%q: want a GPU index", g)}
		}
	}
	if s := q.State; s != "" && s != api.AllValue && !hasVariable(s) && !slices.Contains(JobStates, s) {
		return q, &QueryError{Field: "state", Msg: fmt.Sprintf("%q: want one of %s", s, strings.Join(JobStates, ", "))}
	}
	switch q.Goal {
	case "", "min", "max", api.AllValue:
	default:
		if !hasVariable(q.Goal) {
			return q, &QueryError{Field: "goal", Msg: fmt.Sprintf("%q: want min or max", q.Goal)}
		}
	}
	if q.StragglerPct < 0 || q.StragglerPct > 1000 {
		return q, &QueryError{Field: "stragglerPct", Msg: "want a margin above 0 and at most 1000 percent"}
	}
	return q, nil
}

func validMetric(m string) bool {
	if hasVariable(m) || slices.Contains(stepMetrics, m) {
		return true
	}
	name, ok := strings.CutPrefix(m, "metrics.")
	return ok && name != ""
}
