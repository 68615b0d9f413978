package plugin

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// The per-layer heatmap, as Grafana's Heatmap panel (calculate off) reads
// a heatmap-rows frame: the first field is x, every further number field
// is one row, named by the layer's full name, and a cell's value both
// picks its colour and is the number its tooltip shows.
//
// x is the step where each column's bucket starts (see stepGrid), so the columns
// are labelled by step and do not depend on the dashboard's time range;
// xAxis "time" gives the bucket's start time instead.
//
// The colour: one layer (the output embedding, a loss head) often takes
// several times as long as the rest, and a scale from the smallest to the
// largest cell then paints the transformer blocks, which differ by a few
// per cent, all in one colour. The cells are therefore coloured over a
// robust range: that of the cells within Tukey's fences (the quartiles of
// all cells widened by 1.5 times their spread). Cells beyond it take the
// range's end colour. The panel colours a cell by the value it is given,
// so a cell beyond the range is given a value just inside the range's end
// (each one distinct, and none a value some cell has), and a value mapping
// on the first layer field (whose config the panel copies to every cell)
// maps that value back to the cell's true milliseconds: the tooltip shows
// every cell's absolute time. Just inside, not just past: the panel's
// colour legend is labelled with the smallest and largest values, which
// are then true cells' times printed with the unit, never a mapping's
// text.

// heatmapQuery is a run's layer heatmap, from GET /runs/{id}/heatmap: as
// many columns as the query asks for, else as the panel is wide.
var heatmapQuery = get[api.Heatmap]{
	path: runPathOf("heatmap"),
	params: func(r request) params {
		p := params{}
		p.set("pass", r.Pass)
		p.oneRank(r.Rank)
		switch {
		case r.MaxSteps > 0:
			p.set("max_steps", strconv.Itoa(min(r.MaxSteps, maxPointsLimit)))
		case r.maxDataPoints > 0:
			p.set("max_steps", strconv.FormatInt(min(r.maxDataPoints, maxPointsLimit), 10))
		}
		p.step("from_step", r.FromStep)
		p.step("to_step", r.ToStep)
		return p
	},
	frames: func(r request, h api.Heatmap) data.Frames { return data.Frames{heatmapFrame(r.PluginQuery, h)} },
}

// heatmapFrame is the heatmap-rows frame of h.
func heatmapFrame(q api.PluginQuery, h api.Heatmap) *data.Frame {
	fields := make([]*data.Field, 0, len(h.Layers)+1)
	if q.XAxis == "time" {
		t := make([]time.Time, len(h.Times))
		copy(t, h.Times)
		fields = append(fields, data.NewField("time", nil, t).SetConfig(&data.FieldConfig{DisplayNameFromDS: "Step bucket start"}))
	}
	// at[j] is the frame column of the server's column j.
	at := make([]int, len(h.Steps))
	cols := len(h.Steps)
	for j := range at {
		at[j] = j
	}
	if q.XAxis != "time" {
		var xs []int64
		xs, at = stepGrid(h.Steps, h.BucketSteps)
		cols = len(xs)
		fields = append(fields, data.NewField("step", nil, xs).SetConfig(&data.FieldConfig{DisplayNameFromDS: "Step", Unit: "none"}))
	}
	rows := make([][]*float64, len(h.Layers))
	for i := range h.Layers {
		rows[i] = make([]*float64, cols)
		if i < len(h.Values) {
			for j := 0; j < len(at) && j < len(h.Values[i]); j++ {
				rows[i][at[j]] = fp(h.Values[i][j])
			}
		}
	}
	scale := clipToColourRange(rows)
	for i, layer := range h.Layers {
		cfg := &data.FieldConfig{Unit: "ms"}
		if i == 0 && len(scale.mapped) > 0 {
			cfg.Mappings = data.ValueMappings{scale.mapped}
		}
		fields = append(fields, data.NewField(layer, nil, rows[i]).SetConfig(cfg))
	}
	f := data.NewFrame(h.Pass, fields...)
	custom := map[string]any{"pass": h.Pass, "rank": h.Rank, "bucket_steps": h.BucketSteps, "steps": slices.Clone(h.Steps)}
	if scale.ok {
		custom["colour_min_ms"], custom["colour_max_ms"] = scale.lo, scale.hi
	}
	f.Meta = &data.FrameMeta{Type: FrameTypeHeatmapRows, TypeVersion: data.FrameTypeVersion{0, 1}, Custom: custom}
	if h.Notice != "" {
		// Shown on the panel instead of an empty chart without a word.
		f.Meta.Notices = []data.Notice{{Severity: data.NoticeSeverityInfo, Text: h.Notice}}
	}
	if n := len(scale.mapped); n > 0 {
		f.Meta.Notices = append(f.Meta.Notices, data.Notice{Severity: data.NoticeSeverityInfo, Text: fmt.Sprintf(
			"Colours span %.3f–%.3f ms, the range of most cells; %d cells beyond it show the end colour, and their own time on hover.",
			scale.lo, scale.hi, n)})
	}
	return f
}

// stepGrid places the columns, labelled by their buckets' first steps, on an
// evenly spaced step axis: Grafana's Heatmap panel takes the distance
// between the first two columns as every cell's width and puts its step
// ticks at most nine such distances apart, so uneven columns (a bucket
// whose first step is late, an empty bucket) would make every cell and
// tick spacing as narrow as the closest pair. Each step is moved down to
// its bucket's start (the server's buckets are multiples of width), the
// spacing is the greatest common divisor of the gaps (the recording
// cadence, at least a bucket), and missing columns are empty. The grid
// has at most one column per bucket of the server's plan. at[j] is the
// grid column of steps[j].
func stepGrid(steps []int64, width int64) (xs []int64, at []int) {
	at = make([]int, len(steps))
	if len(steps) == 0 {
		return []int64{}, at
	}
	width = max(width, 1)
	snapped := make([]int64, len(steps))
	var d int64
	for j, s := range steps {
		snapped[j] = s / width * width
		if j > 0 {
			if gap := snapped[j] - snapped[j-1]; gap > 0 {
				d = gcd(d, gap)
			}
		}
	}
	if d == 0 {
		d = width
	}
	first := snapped[0]
	n := (snapped[len(snapped)-1]-first)/d + 1
	xs = make([]int64, n)
	for k := range xs {
		xs[k] = first + int64(k)*d
	}
	for j, s := range snapped {
		at[j] = int((s - first) / d)
	}
	return xs, at
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// colourScale is what clipToColourRange did.
type colourScale struct {
	ok     bool    // some cell has a value
	lo, hi float64 // the colour range
	// mapped gives, for each cell moved to the range's end, its colour
	// value (as Grafana prints the number) and its true milliseconds.
	mapped data.ValueMapper
}

// clipToColourRange moves the cells beyond the robust range to just past
// its ends, in place, and returns the range and the mapping back.
func clipToColourRange(rows [][]*float64) colourScale {
	var all []float64
	for _, r := range rows {
		for _, v := range r {
			if v != nil && !math.IsNaN(*v) && !math.IsInf(*v, 0) {
				all = append(all, *v)
			}
		}
	}
	if len(all) == 0 {
		return colourScale{}
	}
	lo, hi := colourRange(all)
	s := colourScale{ok: true, lo: lo, hi: hi}
	if hi <= lo {
		// Most cells equal: the full range is the only useful one.
		s.lo, s.hi = slices.Min(all), slices.Max(all)
		return s
	}
	// Far below the range's width and far above float64's resolution at
	// its ends, so moved cells keep their end colour and stay distinct.
	eps := (hi - lo) * 1e-9
	taken := make(map[float64]bool, len(all))
	for _, v := range all {
		taken[v] = true
	}
	// next is the k-th free value stepping from end towards the range.
	next := func(end, dir float64, k *int) float64 {
		for {
			*k++
			if c := end + dir*float64(*k)*eps; !taken[c] {
				taken[c] = true
				return c
			}
		}
	}
	above, below := 0, 0
	for _, r := range rows {
		for j, v := range r {
			if v == nil || math.IsNaN(*v) || math.IsInf(*v, 0) {
				continue
			}
			var c float64
			var where string
			switch {
			case *v > hi:
				c, where = next(hi, -1, &above), "above"
			case *v < lo:
				c, where = next(lo, 1, &below), "below"
			default:
				continue
			}
			if s.mapped == nil {
				s.mapped = data.ValueMapper{}
			}
			s.mapped[jsNumber(c)] = data.ValueMappingResult{Text: fmt.Sprintf("%.3f ms (%s the colour range)", *v, where)}
			r[j] = &c
		}
	}
	return s
}

// colourRange returns the smallest and largest of v within Tukey's
// fences: the first and third quartiles widened by 1.5 times their
// difference. No colour is spent on values no cell has.
func colourRange(v []float64) (lo, hi float64) {
	s := slices.Clone(v)
	slices.Sort(s)
	q1, q3 := quantile(s, 0.25), quantile(s, 0.75)
	iqr := q3 - q1
	fenceLo, fenceHi := q1-1.5*iqr, q3+1.5*iqr
	lo, hi = s[len(s)-1], s[0]
	for _, x := range s {
		if x >= fenceLo && x <= fenceHi {
			lo, hi = min(lo, x), max(hi, x)
		}
	}
	return lo, hi
}

// quantile of sorted s, linearly interpolated between ranks.
func quantile(s []float64, q float64) float64 {
	pos := q * float64(len(s)-1)
	i := int(pos)
	if i+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[i] + (pos-float64(i))*(s[i+1]-s[i])
}

// jsNumber prints f as JavaScript's String(f) does, the key a value
// mapping is looked up by: the shortest digits that read back as f, in
// plain notation from 1e-6 up to 1e21 and in exponent notation ("1e-7",
// "1.5e+21") beyond.
func jsNumber(f float64) string {
	switch {
	case f == 0:
		return "0"
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	if a := math.Abs(f); a >= 1e-6 && a < 1e21 {
		return strconv.FormatFloat(f, 'f', -1, 64)
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // 1.5e-07, 1e+21
	mant, exp, _ := strings.Cut(s, "e")
	sign := exp[:1]
	exp = strings.TrimLeft(exp[1:], "0")
	return mant + "e" + sign + exp
}

// FrameTypeHeatmapRows is the frame type Grafana's Heatmap panel reads as
// ready-made rows (x first, then one numeric field per y bucket). The SDK
// has no constant for it.
const FrameTypeHeatmapRows data.FrameType = "heatmap-rows"
