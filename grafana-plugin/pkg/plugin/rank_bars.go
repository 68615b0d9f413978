package plugin

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// RankBarFigures are the figures of the ranks frame a per-rank bar chart
// (api.PartBars) can draw, by field name.
var RankBarFigures = []string{"busy_ms", "sync_wait_ms", "lateness_ms", "median_step_ms", "wait_ms"}

// rankBarsFrame is the ranks frame cut to the rows of a bar chart of
// figure: every rank, the largest figure first, up to api.MaxRankBars;
// past that, the flagged ranks and, of the others, the largest, the
// smallest and ranks evenly between in the order of the figure (a rank
// without the figure last), so that a thousand ranks draw as their
// distribution with the stragglers named, not as hairlines. Every figure
// is the server's; the plugin only picks rows. The frame's notice says
// what the bars stand for.
func rankBarsFrame(r api.RanksResponse, figure string) *data.Frame {
	value := rankFigure(figure)
	order := slices.Clone(r.Ranks)
	slices.SortStableFunc(order, func(a, b api.RankStat) int { return cmpFigure(value(b), value(a)) })
	if len(order) <= api.MaxRankBars {
		r.Ranks = order
		return ranksFrame(r)
	}
	var flagged, rest []api.RankStat
	for _, s := range order {
		if s.Straggler && len(flagged) < api.MaxRankBars-2 {
			flagged = append(flagged, s)
		} else {
			rest = append(rest, s)
		}
	}
	keep := api.MaxRankBars - len(flagged)
	picked := make([]api.RankStat, 0, api.MaxRankBars)
	picked = append(picked, flagged...)
	for j := range keep {
		picked = append(picked, rest[j*(len(rest)-1)/(keep-1)])
	}
	slices.SortStableFunc(picked, func(a, b api.RankStat) int { return cmpFigure(value(b), value(a)) })
	total := len(r.Ranks)
	r.Ranks = picked
	f := ranksFrame(r)
	f.AppendNotices(data.Notice{Severity: data.NoticeSeverityInfo, Text: fmt.Sprintf(
		"%d ranks: %d bars, the %d flagged and %d of the others evenly from the largest to the smallest, about one of every %d",
		total, len(picked), len(flagged), keep, (len(rest)+keep-1)/keep)})
	return f
}

// rankFigure reads one of RankBarFigures from a rank's figures; nil when
// the rank has none.
func rankFigure(figure string) func(api.RankStat) *float64 {
	switch figure {
	case "busy_ms":
		return func(s api.RankStat) *float64 { return fp(s.BusyMS) }
	case "sync_wait_ms":
		return func(s api.RankStat) *float64 { return fp(s.SyncWaitMS) }
	case "lateness_ms":
		return func(s api.RankStat) *float64 { return fp(s.LatenessMS) }
	case "median_step_ms":
		return func(s api.RankStat) *float64 { return fv(s.MedianStepMS) }
	}
	return func(s api.RankStat) *float64 { return fv(s.WaitMS) }
}

// cmpFigure orders figures ascending, a missing or NaN figure lowest.
func cmpFigure(a, b *float64) int {
	known := func(p *float64) bool { return p != nil && !math.IsNaN(*p) }
	switch {
	case !known(a) && !known(b):
		return 0
	case !known(a):
		return -1
	case !known(b):
		return 1
	}
	return cmp.Compare(*a, *b)
}
