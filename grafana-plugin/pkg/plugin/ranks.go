package plugin

import (
	"strconv"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// ranksQuery is a run's ranks, from GET /runs/{id}/ranks: the per-rank
// table, its hosts, or, numeric, a field per rank and figure.
var ranksQuery = get[api.RanksResponse]{
	path: runPathOf("ranks"),
	params: func(r request) params {
		p := params{}
		if r.StragglerPct > 0 {
			p.set("straggler_pct", strconv.FormatFloat(r.StragglerPct, 'g', -1, 64))
		}
		return p
	},
	frames: func(r request, rr api.RanksResponse) data.Frames {
		switch {
		case r.Format == api.FormatNumeric:
			return data.Frames{ranksNumericFrame(r.RunID, rr)}
		case r.Part == api.PartHosts:
			return data.Frames{hostsFrame(rr)}
		case r.Part == api.PartBars:
			return data.Frames{rankBarsFrame(rr, r.Metrics[0])}
		}
		return data.Frames{ranksFrame(rr)}
	},
}

// ranksFrame is the per-rank table (and the bars of step time per rank).
func ranksFrame(r api.RanksResponse) *data.Frame {
	rows := r.Ranks
	f := data.NewFrame("ranks",
		intCol(rows, "rank", "Rank", func(s api.RankStat) *int64 { return i64(int64(s.Rank)) }),
		// The rank as a name, for the x axis of bar charts, which label
		// bars with a string field.
		strCol(rows, "rank_name", "Rank name", func(s api.RankStat) string { return "rank " + strconv.Itoa(s.Rank) }),
		strCol(rows, "host", "Host", func(s api.RankStat) string { return s.Host }),
		intCol(rows, "steps", "Steps", func(s api.RankStat) *int64 { return i64(s.Steps) }),
		numCol(rows, "median_step_ms", "ms", "Median step", func(s api.RankStat) *float64 { return fv(s.MedianStepMS) }),
		numCol(rows, "p95_step_ms", "ms", "p95 step", func(s api.RankStat) *float64 { return fv(s.P95StepMS) }),
		numCol(rows, "mean_gpu_util_pct", "percent", "Mean GPU util", func(s api.RankStat) *float64 { return fp(s.MeanGPUUtil) }),
		numCol(rows, "peak_gpu_mem_gb", "decgbytes", "Peak GPU memory", func(s api.RankStat) *float64 { return fp(s.PeakMemGB) }),
		numCol(rows, "wait_ms", "ms", "Waiting on others", func(s api.RankStat) *float64 { return fv(s.WaitMS) }),
		numCol(rows, "busy_ms", "ms", "Busy", func(s api.RankStat) *float64 { return fp(s.BusyMS) }),
		numCol(rows, "sync_wait_ms", "ms", "Wait in collective", func(s api.RankStat) *float64 { return fp(s.SyncWaitMS) }),
		numCol(rows, "lateness_ms", "ms", "Lateness", func(s api.RankStat) *float64 { return fp(s.LatenessMS) }),
		numCol(rows, "last_pct", "percent", "Arrived last", func(s api.RankStat) *float64 { return fp(s.LastPct) }),
		numCol(rows, "straggler_score", "percentunit", "Straggler score", func(s api.RankStat) *float64 { return fp(s.StragglerScore) }),
		numCol(rows, "own_excess_ms", "ms", "Own excess", func(s api.RankStat) *float64 { return fp(s.OwnExcessMS) }),
		strCol(rows, "own_cause", "Cause", func(s api.RankStat) string { return s.OwnCause }),
		numCol(rows, "hidden_wait_ms", "ms", "Hidden wait", func(s api.RankStat) *float64 { return fp(s.HiddenWaitMS) }),
		numCol(rows, "delay_ms", "ms", "Delay", func(s api.RankStat) *float64 { return fp(s.DelayMS) }),
		strCol(rows, "straggler_by", "Named by", func(s api.RankStat) string { return s.StragglerBy }),
		boolCol(rows, "straggler", "Straggler", func(s api.RankStat) bool { return s.Straggler }),
	)
	f.Meta = &data.FrameMeta{Custom: ranksMeta(r)}
	return f
}

// hostsFrame is the ranks rolled up by host, in the server's order (the
// slowest host first), so that a slow node reads as one row.
func hostsFrame(r api.RanksResponse) *data.Frame {
	rows := r.Hosts
	f := data.NewFrame("hosts",
		strCol(rows, "host", "Host", func(h api.HostStat) string { return h.Host }),
		intCol(rows, "ranks", "Ranks", func(h api.HostStat) *int64 { return i64(int64(h.Ranks)) }),
		intCol(rows, "stragglers", "Stragglers", func(h api.HostStat) *int64 { return i64(int64(h.Stragglers)) }),
		intCol(rows, "worst_rank", "Worst rank", func(h api.HostStat) *int64 { return i64(int64(h.WorstRank)) }),
		numCol(rows, "max_lateness_ms", "ms", "Max lateness", func(h api.HostStat) *float64 { return fp(h.MaxLatenessMS) }),
		numCol(rows, "mean_lateness_ms", "ms", "Mean lateness", func(h api.HostStat) *float64 { return fp(h.MeanLatenessMS) }),
		numCol(rows, "max_step_ms", "ms", "Max step time", func(h api.HostStat) *float64 { return fp(h.MaxStepMS) }),
		numCol(rows, "mean_gpu_util_pct", "percent", "Mean GPU util", func(h api.HostStat) *float64 { return fp(h.MeanGPUUtil) }),
		numCol(rows, "max_straggler_score", "percentunit", "Max straggler score", func(h api.HostStat) *float64 { return fp(h.MaxScore) }),
	)
	f.Meta = &data.FrameMeta{Custom: ranksMeta(r)}
	return f
}

// ranksMeta is what both frames of a ranks query carry about how the
// figures were made.
func ranksMeta(r api.RanksResponse) map[string]any {
	return map[string]any{"median_step_ms": fv(r.MedianStepMS), "straggler_pct": fv(r.StragglerPct),
		"lateness_from": r.LatenessFrom, "from_step": r.FromStep, "basis": r.Basis}
}

// ranksNumericFrame is ranks for alert rules: each rank's figures as
// number fields labelled run_id, rank and host, straggler as 1 or 0; an
// alert on straggler > 0 fires once per straggling rank.
func ranksNumericFrame(runID string, r api.RanksResponse) *data.Frame {
	var fields []*data.Field
	for _, s := range r.Ranks {
		labels := data.Labels{"run_id": runID, "rank": strconv.Itoa(s.Rank), "host": s.Host}
		straggler := 0.0
		if s.Straggler {
			straggler = 1
		}
		fields = append(fields,
			numericField("median_step_ms", "ms", labels, fv(s.MedianStepMS)),
			numericField("p95_step_ms", "ms", labels, fv(s.P95StepMS)),
			numericField("wait_ms", "ms", labels, fv(s.WaitMS)),
			numericField("lateness_ms", "ms", labels, fp(s.LatenessMS)),
			numericField("straggler_score", "percentunit", labels, fp(s.StragglerScore)),
			numericField("own_excess_ms", "ms", labels, fp(s.OwnExcessMS)),
			numericField("mean_gpu_util_pct", "percent", labels, fp(s.MeanGPUUtil)),
			numericField("peak_gpu_mem_gb", "decgbytes", labels, fp(s.PeakMemGB)),
			numericField("straggler", "none", labels, &straggler),
		)
	}
	return numericFrame("ranks", fields)
}
