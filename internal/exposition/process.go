package exposition

import (
	"bufio"
	"bytes"
	"io"
	"strings"

	"github.com/VictoriaMetrics/metrics"
)

// WriteProcess writes the Go runtime's and the process's metrics (go_*,
// process_*: memory, CPU, goroutines, open files) as the library reads
// them, each family under a # HELP and # TYPE: a histogram or summary by
// its samples, a counter when its name ends in _total, else a gauge. The
// runtime's own histograms are left out: the library writes them without
// _sum and _count, which histogram_quantile's users expect; so is
// go_info_ext, which names the build machine's GOROOT.
func WriteProcess(w io.Writer) error {
	var raw bytes.Buffer
	metrics.WriteProcessMetrics(&raw)
	metrics.WriteFDMetrics(&raw)
	var fam processFamily
	sc := bufio.NewScanner(&raw)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels := splitSample(line)
		base, typ := name, ""
		switch {
		case strings.HasSuffix(name, "_bucket") && strings.Contains(labels, "le="):
			base, typ = strings.TrimSuffix(name, "_bucket"), "histogram"
		case strings.Contains(labels, "quantile="):
			typ = "summary"
		case fam.base != "" && (name == fam.base+"_sum" || name == fam.base+"_count") && (fam.typ == "histogram" || fam.typ == "summary"):
			base, typ = fam.base, fam.typ
			fam.complete = fam.complete || name == fam.base+"_count"
		case strings.HasSuffix(name, "_total"):
			typ = "counter"
		default:
			typ = "gauge"
		}
		if base != fam.base {
			fam.flush(w)
			fam = processFamily{base: base, typ: typ}
		}
		fam.lines = append(fam.lines, line)
	}
	fam.flush(w)
	return nil
}

type processFamily struct {
	base, typ string
	complete  bool // a histogram's _count is there
	lines     []string
}

func (f *processFamily) flush(w io.Writer) {
	if f.base == "" || f.base == "go_info_ext" || (f.typ == "histogram" && !f.complete) {
		return
	}
	Header(w, f.base, "Go runtime or process statistic "+f.base+", as github.com/VictoriaMetrics/metrics reads it.", f.typ)
	for _, l := range f.lines {
		io.WriteString(w, l+"\n")
	}
}

// splitSample splits a sample line into its name and its labels (with
// braces; "" for none).
func splitSample(line string) (name, labels string) {
	end := strings.IndexAny(line, "{ ")
	if end < 0 {
		return line, ""
	}
	name = line[:end]
	if line[end] == '{' {
		if c := strings.LastIndexByte(line, '}'); c > end {
			labels = line[end : c+1]
		}
	}
	return name, labels
}
