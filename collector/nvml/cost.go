package nvml

import (
	"runtime"
	"sort"
	"syscall"
	"time"
	"unsafe"
)

// CallCost is what one kind of NVML call cost while a capture was taken:
// CPU time on the calling thread (user and system: the driver's ioctl work
// counts there) and wall time, in nanoseconds. The first maxCostSamples
// calls are kept in order so that [Fake] can replay them.
type CallCost struct {
	N         int     `json:"n"`
	CPUNsSum  int64   `json:"cpu_ns_sum"`
	WallNsSum int64   `json:"wall_ns_sum"`
	CPUNs     []int64 `json:"cpu_ns"`
	WallNs    []int64 `json:"wall_ns"`
	// Unsupported: the device refused the call, so Read made it once.
	Unsupported bool `json:"unsupported,omitempty"`
}

const maxCostSamples = 256

func (c *CallCost) add(cpu, wall int64) {
	c.N++
	c.CPUNsSum += cpu
	c.WallNsSum += wall
	if len(c.CPUNs) < maxCostSamples {
		c.CPUNs = append(c.CPUNs, cpu)
		c.WallNs = append(c.WallNs, wall)
	}
}

// MeanCPU is the mean CPU time of one call.
func (c *CallCost) MeanCPU() time.Duration {
	if c.N == 0 {
		return 0
	}
	return time.Duration(c.CPUNsSum / int64(c.N))
}

// MedianCPU is the median CPU time of the kept samples.
func (c *CallCost) MedianCPU() time.Duration {
	if len(c.CPUNs) == 0 {
		return 0
	}
	s := append([]int64(nil), c.CPUNs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return time.Duration(s[len(s)/2])
}

// CostRecorder is implemented by an Iface that can time its NVML calls.
type CostRecorder interface {
	// RecordCosts turns timing on; it must be called before Init.
	RecordCosts()
	// Costs returns a copy of what was recorded, by call name.
	Costs() map[string]*CallCost
}

// costBook times calls when on; when off, mark and note cost one branch.
type costBook struct {
	on    bool
	calls map[string]*CallCost
}

type costMark struct{ cpu, wall int64 }

func (b *costBook) mark() costMark {
	if !b.on {
		return costMark{}
	}
	return costMark{cpu: threadCPUNanos(), wall: time.Now().UnixNano()}
}

func (b *costBook) note(name string, m costMark) {
	if !b.on {
		return
	}
	cpu, wall := threadCPUNanos()-m.cpu, time.Now().UnixNano()-m.wall
	if b.calls == nil {
		b.calls = map[string]*CallCost{}
	}
	c := b.calls[name]
	if c == nil {
		c = &CallCost{}
		b.calls[name] = c
	}
	c.add(cpu, wall)
}

func (b *costBook) copy() map[string]*CallCost {
	out := make(map[string]*CallCost, len(b.calls))
	for k, v := range b.calls {
		c := *v
		c.CPUNs = append([]int64(nil), v.CPUNs...)
		c.WallNs = append([]int64(nil), v.WallNs...)
		out[k] = &c
	}
	return out
}

// threadCPUNanos is the CPU time the calling OS thread has used. Callers
// lock the goroutine to its thread while they compare two readings.
func threadCPUNanos() int64 {
	var ts syscall.Timespec
	const clockThreadCPUTimeID = 3 // CLOCK_THREAD_CPUTIME_ID
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return time.Now().UnixNano()
	}
	return ts.Nano()
}

// spendCPU keeps the calling thread busy for d of its own CPU time, then
// waits out the rest of wall, as the replayed call took that long.
func spendCPU(cpu, wall time.Duration) {
	if cpu <= 0 && wall <= 0 {
		return
	}
	start := time.Now()
	if cpu > 0 {
		runtime.LockOSThread()
		end := threadCPUNanos() + int64(cpu)
		for threadCPUNanos() < end {
		}
		runtime.UnlockOSThread()
	}
	// Waits under 50µs are not worth a timer: the wake-up would cost more
	// than the call's idle part did.
	if rest := wall - time.Since(start); rest > 50*time.Microsecond {
		time.Sleep(rest)
	}
}
