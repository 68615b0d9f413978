package nvml

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Fake replays a [Capture]: each Read of a device returns that device's
// next recorded reading, wrapping around at the end, with the fields not
// asked for left nil. When the capture holds call costs, each Read also
// spends the CPU and wall time that the calls [Real] would have made for
// the same fields cost when the capture was taken, so that a load test
// over the fake pays what the real library costs.
type Fake struct {
	mu      sync.Mutex
	devices []DeviceInfo
	src     []int // capture device behind each fake device
	samples [][]Reading
	next    []int
	costs   [numCalls]*CallCost
	cursor  [numCalls]int
	tried   []callSet // unsupported calls each device has made once
	reads   [][numCalls]int
	// InitErr, when set, is returned by Init, as a machine without the
	// library would.
	InitErr error
	// NoCosts turns the replay of call costs off.
	NoCosts bool
}

var _ Iface = (*Fake)(nil)

// NewFake replays c. With gpus > 0 it shows that many GPUs, repeating the
// captured ones with their own index, UUID and bus ID.
func NewFake(c Capture, gpus int) *Fake {
	f := &Fake{samples: c.Samples}
	if gpus <= 0 {
		gpus = len(c.Devices)
	}
	for i := 0; i < gpus; i++ {
		src := i % len(c.Devices)
		d := c.Devices[src]
		if i >= len(c.Devices) {
			d.Index = i
			d.Minor = i
			d.UUID = fmt.Sprintf("%s-%d", d.UUID, i)
			d.PCIBusID = fmt.Sprintf("00000000:%02X:00.0", 0x10+i)
		}
		f.devices = append(f.devices, d)
		f.src = append(f.src, src)
	}
	f.next = make([]int, gpus)
	f.tried = make([]callSet, gpus)
	f.reads = make([][numCalls]int, gpus)
	for k := call(0); k < numCalls; k++ {
		if cc := c.Costs[callNames[k]]; cc != nil && len(cc.CPUNs) > 0 && len(cc.WallNs) == len(cc.CPUNs) {
			f.costs[k] = cc
		}
	}
	return f
}

// Calls counts, by call name, the calls the fake has replayed as Real
// would have made them for device i.
func (f *Fake) Calls(i int) map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for c, n := range f.reads[i] {
		if n > 0 {
			out[callNames[c]] = n
		}
	}
	return out
}

// replay spends what the calls Real makes for want on device i cost.
func (f *Fake) replay(i int, want Fields) {
	d := f.devices[i]
	for k := range nvmlCalls {
		c, nc := call(k), &nvmlCalls[k]
		if want&nc.group == 0 || (d.MIG != nil && nc.phys) {
			continue
		}
		cc := f.costs[c]
		if cc == nil || f.tried[i].has(c) {
			continue
		}
		if cc.Unsupported {
			f.tried[i].add(c)
		}
		f.reads[i][c]++
		if f.NoCosts {
			continue
		}
		n := f.cursor[c] % len(cc.CPUNs)
		f.cursor[c]++
		f.mu.Unlock()
		spendCPU(time.Duration(cc.CPUNs[n]), time.Duration(cc.WallNs[n]))
		f.mu.Lock()
	}
}

// Seek makes the next Read of every device return tick t of the capture.
func (f *Fake) Seek(t int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.next {
		f.next[i] = t
	}
}

// Init implements Iface.
func (f *Fake) Init() error { return f.InitErr }

// Shutdown implements Iface.
func (f *Fake) Shutdown() error { return nil }

// Devices implements Iface.
func (f *Fake) Devices() []DeviceInfo {
	return append([]DeviceInfo(nil), f.devices...)
}

// Read implements Iface.
func (f *Fake) Read(i int, want Fields) (Reading, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i < 0 || i >= len(f.devices) {
		return Reading{}, fmt.Errorf("nvml: no device %d", i)
	}
	f.replay(i, want)
	t := f.next[i] % len(f.samples)
	f.next[i]++
	return Reading{}.With(f.samples[t][f.src[i]], want), nil
}

// Recorder passes every call to Inner and writes what it read to Path in
// the capture format, rewriting the file after each complete round of
// reads so that a stopped collector leaves a valid capture.
type Recorder struct {
	Inner  Iface
	Path   string
	Source string

	mu     sync.Mutex
	cap    Capture
	latest []Reading
	seen   []bool
	err    error
}

var _ Iface = (*Recorder)(nil)

// Init implements Iface.
// When Inner can time its calls, the capture holds their costs too.
func (r *Recorder) Init() error {
	if cr, ok := r.Inner.(CostRecorder); ok {
		cr.RecordCosts()
	}
	if err := r.Inner.Init(); err != nil {
		return err
	}
	r.cap.Devices = r.Inner.Devices()
	r.cap.Source = r.Source
	r.latest = make([]Reading, len(r.cap.Devices))
	r.seen = make([]bool, len(r.cap.Devices))
	return nil
}

// Shutdown implements Iface.
func (r *Recorder) Shutdown() error { return r.Inner.Shutdown() }

// Devices implements Iface.
func (r *Recorder) Devices() []DeviceInfo { return r.Inner.Devices() }

// Read implements Iface. A device's fields read less often keep their
// last value in the capture; a row is complete once every device has been
// read since the last one.
func (r *Recorder) Read(i int, want Fields) (Reading, error) {
	rd, err := r.Inner.Read(i, want)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil || i < 0 || i >= len(r.latest) {
		return rd, err
	}
	r.latest[i] = r.latest[i].With(rd, want)
	r.seen[i] = true
	for _, s := range r.seen {
		if !s {
			return rd, err
		}
	}
	r.cap.Samples = append(r.cap.Samples, append([]Reading(nil), r.latest...))
	clear(r.seen)
	if cr, ok := r.Inner.(CostRecorder); ok {
		r.cap.Costs = cr.Costs()
	}
	if werr := r.write(); werr != nil && r.err == nil {
		r.err = werr
	}
	return rd, err
}

// Err returns the first error met writing the capture.
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func (r *Recorder) write() error {
	b, err := json.MarshalIndent(r.cap, "", " ")
	if err != nil {
		return fmt.Errorf("nvml: capture: %w", err)
	}
	tmp := r.Path + ".tmp"
	if err := os.MkdirAll(filepath.Dir(r.Path), 0o755); err != nil {
		return fmt.Errorf("nvml: capture: %w", err)
	}
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("nvml: capture: %w", err)
	}
	if err := os.Rename(tmp, r.Path); err != nil {
		return fmt.Errorf("nvml: capture: %w", err)
	}
	return nil
}
