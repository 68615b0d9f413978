package nvml

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// Fake replays a [Capture]: each Read of a device returns that device's
// next recorded reading, wrapping around at the end.
type Fake struct {
	mu      sync.Mutex
	devices []DeviceInfo
	src     []int // capture device behind each fake device
	samples [][]Reading
	next    []int
	// InitErr, when set, is returned by Init, as a machine without the
	// library would.
	InitErr error
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
	return f
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
func (f *Fake) Read(i int) (Reading, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i < 0 || i >= len(f.devices) {
		return Reading{}, fmt.Errorf("nvml: no device %d", i)
	}
	t := f.next[i] % len(f.samples)
	f.next[i]++
	return f.samples[t][f.src[i]], nil
}

// Recorder passes every call to Inner and writes what it read to Path in
// the capture format, rewriting the file after each complete round of
// reads so that a stopped collector leaves a valid capture.
type Recorder struct {
	Inner  Iface
	Path   string
	Source string

	mu  sync.Mutex
	cap Capture
	row []Reading
	err error
}

var _ Iface = (*Recorder)(nil)

// Init implements Iface.
func (r *Recorder) Init() error {
	if err := r.Inner.Init(); err != nil {
		return err
	}
	r.cap.Devices = r.Inner.Devices()
	r.cap.Source = r.Source
	return nil
}

// Shutdown implements Iface.
func (r *Recorder) Shutdown() error { return r.Inner.Shutdown() }

// Devices implements Iface.
func (r *Recorder) Devices() []DeviceInfo { return r.Inner.Devices() }

// Read implements Iface.
func (r *Recorder) Read(i int) (Reading, error) {
	rd, err := r.Inner.Read(i)
	r.mu.Lock()
	defer r.mu.Unlock()
	if i == 0 {
		r.row = make([]Reading, len(r.cap.Devices))
	}
	if r.row != nil && i < len(r.row) {
		r.row[i] = rd
		if i == len(r.row)-1 {
			r.cap.Samples = append(r.cap.Samples, r.row)
			r.row = nil
			if werr := r.write(); werr != nil && r.err == nil {
				r.err = werr
			}
		}
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
