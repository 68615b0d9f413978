package collector

import (
	"bufio"
	"bytes"
	"fmt"
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
	if busy, total, err := readCPU(filepath.Join(h.root, "stat")); err != nil {
		firstErr = err
	} else {
		if h.havePrev && total > h.prevTotal {
			out.rec.CPUUtilPct = api.F(round3(100 * float64(busy-h.prevBusy) / float64(total-h.prevTotal)))
		}
		h.prevBusy, h.prevTotal, h.havePrev = busy, total, true
	}
	if used, total, err := readMem(filepath.Join(h.root, "meminfo")); err != nil {
		if firstErr == nil {
			firstErr = err
		}
	} else {
		out.rec.MemUsedBytes, out.rec.MemTotalBytes = api.F(used), api.F(total)
	}
	if b, err := os.ReadFile(filepath.Join(h.root, "loadavg")); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if v, err := strconv.ParseFloat(f[0], 64); err == nil {
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
func readCPU(path string) (busy, total uint64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, fmt.Errorf("host: %w", err)
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("host: %s: no cpu line", path)
	}
	var v [8]uint64
	for i := 1; i < len(f) && i <= 8; i++ {
		v[i-1], _ = strconv.ParseUint(f[i], 10, 64)
	}
	// user nice system idle iowait irq softirq steal; guest time is
	// already counted in user.
	for _, x := range v {
		total += x
	}
	return total - v[3] - v[4], total, nil
}

func readMem(path string) (used, total float64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, fmt.Errorf("host: %w", err)
	}
	defer f.Close()
	var tot, avail float64
	var haveTot, haveAvail bool
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fs := strings.Fields(rest)
		if len(fs) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fs[0], 64)
		if err != nil {
			continue
		}
		switch k {
		case "MemTotal":
			tot, haveTot = v*1024, true
		case "MemAvailable":
			avail, haveAvail = v*1024, true
		}
	}
	if !haveTot || !haveAvail {
		return 0, 0, fmt.Errorf("host: %s: no MemTotal or MemAvailable", path)
	}
	return tot - avail, tot, nil
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
