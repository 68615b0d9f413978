package collector

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/deepseed/deepseed/api"
)

// userHZ is the kernel's clock tick for /proc times; 100 on every Linux
// architecture the collector targets.
const userHZ = 100

// hostSampler reads CPU, memory and the announced processes from /proc.
type hostSampler struct {
	root string // usually /proc; tests point it at a fixture

	prevBusy, prevTotal uint64
	havePrev            bool
	prevProc            map[int64]procTimes

	// The host-wide files stay open and are re-read from offset 0, which
	// makes the kernel render them afresh: one pread a file per sample
	// instead of open, stat, read and close. buf is reused for every read.
	stat, meminfo, loadavg procFile
	buf                    []byte
}

// close releases the files kept open.
func (h *hostSampler) close() {
	for _, p := range []*procFile{&h.stat, &h.meminfo, &h.loadavg} {
		if p.f != nil {
			p.f.Close()
			p.f = nil
		}
	}
}

// procFile is a /proc file kept open between samples.
type procFile struct {
	f *os.File
}

// read renders path into buf (grown as needed) and returns the content.
// On an error the file is closed, to be opened again next time.
func (p *procFile) read(path string, buf *[]byte) ([]byte, error) {
	if p.f == nil {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		p.f = f
	}
	if len(*buf) == 0 {
		*buf = make([]byte, 4096)
	}
	for {
		n, err := p.f.ReadAt(*buf, 0)
		if err == io.EOF || (err == nil && n < len(*buf)) {
			return (*buf)[:n], nil
		}
		if err != nil {
			p.f.Close()
			p.f = nil
			return nil, err
		}
		// Filled the buffer: the file may be longer; read it whole again
		// into a bigger one (the content must be one rendering).
		*buf = make([]byte, 2*len(*buf))
	}
}

type procTimes struct {
	ticks uint64
	at    time.Time
}

// hostReading is what the sampler found; nil fields were not readable.
type hostReading struct {
	rec   api.Host
	procs []hostProc
}

type hostProc struct {
	p        announced
	cpuPct   *float64
	cpuSecs  float64
	rssBytes *float64
	gone     bool
}

func (h *hostSampler) sample(now time.Time, host string, procs []announced) (hostReading, error) {
	out := hostReading{rec: api.Host{Kind: api.KindHost, Time: api.T(now), Host: host}}
	var firstErr error
	if busy, total, err := h.readCPU(); err != nil {
		firstErr = err
	} else {
		if h.havePrev && total > h.prevTotal {
			out.rec.CPUUtilPct = api.F(round3(100 * float64(busy-h.prevBusy) / float64(total-h.prevTotal)))
		}
		h.prevBusy, h.prevTotal, h.havePrev = busy, total, true
	}
	if used, total, err := h.readMem(); err != nil {
		if firstErr == nil {
			firstErr = err
		}
	} else {
		out.rec.MemUsedBytes, out.rec.MemTotalBytes = api.F(used), api.F(total)
	}
	if b, err := h.loadavg.read(filepath.Join(h.root, "loadavg"), &h.buf); err == nil {
		if f := firstField(b); len(f) > 0 {
			if v, err := strconv.ParseFloat(string(f), 64); err == nil {
				out.rec.Load1 = api.F(v)
			}
		}
	}
	next := make(map[int64]procTimes, len(procs))
	for _, p := range procs {
		hp := hostProc{p: p}
		ticks, err := readProcTicks(filepath.Join(h.root, strconv.FormatInt(p.PID, 10), "stat"))
		if err != nil {
			hp.gone = true
			out.procs = append(out.procs, hp)
			continue
		}
		hp.cpuSecs = float64(ticks) / userHZ
		if prev, ok := h.prevProc[p.PID]; ok && now.After(prev.at) && ticks >= prev.ticks {
			hp.cpuPct = ptrF(round3(100 * float64(ticks-prev.ticks) / userHZ / now.Sub(prev.at).Seconds()))
		}
		next[p.PID] = procTimes{ticks: ticks, at: now}
		if rss, err := readRSS(filepath.Join(h.root, strconv.FormatInt(p.PID, 10), "status")); err == nil {
			hp.rssBytes = ptrF(rss)
		}
		out.procs = append(out.procs, hp)
		rp := api.HostProcess{PID: p.PID, RunID: p.RunID, Rank: api.Ptr(p.Rank)}
		if hp.cpuPct != nil {
			rp.CPUPct = api.F(*hp.cpuPct)
		}
		if hp.rssBytes != nil {
			rp.RSSBytes = api.F(*hp.rssBytes)
		}
		out.rec.Processes = append(out.rec.Processes, rp)
	}
	h.prevProc = next
	return out, firstErr
}

// readCPU returns the busy and total jiffies of the "cpu" line.
func (h *hostSampler) readCPU() (busy, total uint64, err error) {
	path := filepath.Join(h.root, "stat")
	b, err := h.stat.read(path, &h.buf)
	if err != nil {
		return 0, 0, fmt.Errorf("host: %w", err)
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	line = bytes.TrimLeft(line, " \t")
	f := firstField(line)
	if string(f) != "cpu" {
		return 0, 0, fmt.Errorf("host: %s: no cpu line", path)
	}
	rest := line[len(f):]
	var v [8]uint64
	nf := 0
	for nf < 8 {
		rest = bytes.TrimLeft(rest, " \t")
		if len(rest) == 0 {
			break
		}
		f := firstField(rest)
		v[nf], _ = strconv.ParseUint(string(f), 10, 64)
		rest = rest[len(f):]
		nf++
	}
	if nf < 4 {
		return 0, 0, fmt.Errorf("host: %s: no cpu line", path)
	}
	// user nice system idle iowait irq softirq steal; guest time is
	// already counted in user.
	for _, x := range v {
		total += x
	}
	return total - v[3] - v[4], total, nil
}

func (h *hostSampler) readMem() (used, total float64, err error) {
	path := filepath.Join(h.root, "meminfo")
	b, err := h.meminfo.read(path, &h.buf)
	if err != nil {
		return 0, 0, fmt.Errorf("host: %w", err)
	}
	var tot, avail float64
	var haveTot, haveAvail bool
	for rest := b; len(rest) > 0 && !(haveTot && haveAvail); {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\n"))
		k, val, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		var dst *float64
		var have *bool
		switch string(k) {
		case "MemTotal":
			dst, have = &tot, &haveTot
		case "MemAvailable":
			dst, have = &avail, &haveAvail
		default:
			continue
		}
		f := firstField(bytes.TrimLeft(val, " \t"))
		if v, err := strconv.ParseFloat(string(f), 64); err == nil {
			*dst, *have = v*1024, true
		}
	}
	if !haveTot || !haveAvail {
		return 0, 0, fmt.Errorf("host: %s: no MemTotal or MemAvailable", path)
	}
	return tot - avail, tot, nil
}

// firstField is b up to its first space, tab or newline; b must not start
// with one.
func firstField(b []byte) []byte {
	if i := bytes.IndexAny(b, " \t\n"); i >= 0 {
		return b[:i]
	}
	return b
}

// readProcTicks returns utime+stime of /proc/<pid>/stat. The command name
// may hold spaces and parentheses, so fields are counted after the last ')'.
func readProcTicks(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("host: %s: malformed", path)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("host: %s: malformed", path)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("host: %s: malformed times", path)
	}
	return ut + st, nil
}

func readRSS(path string) (float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			fs := strings.Fields(rest)
			if len(fs) > 0 {
				v, err := strconv.ParseFloat(fs[0], 64)
				if err == nil {
					return v * 1024, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("host: %s: no VmRSS", path)
}

func ptrF(v float64) *float64 { return &v }

func round3(v float64) float64 {
	return float64(int64(v*1000+0.5)) / 1000
}
