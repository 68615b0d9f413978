package nvml

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Real reads the GPUs through libnvidia-ml, opened at run time.
type Real struct {
	// LibPath is the library to open; empty means the system's
	// libnvidia-ml.so.1.
	LibPath string

	mu     sync.Mutex
	lib    gonvml.Interface
	devs   []*realDev
	events gonvml.EventSet
	Driver string
}

var _ Iface = (*Real)(nil)

type realDev struct {
	h        gonvml.Device
	info     DeviceInfo
	links    []int // active NVLink links
	gpmPrev  gonvml.GpmSample
	gpmCur   gonvml.GpmSample
	gpmValid bool
	xidLast  uint64
	xidCount uint64
}

// ErrNoLibrary is returned by Init when libnvidia-ml cannot be opened.
var ErrNoLibrary = errors.New("nvml: libnvidia-ml.so.1 not found (no NVIDIA driver on this machine?)")

// Init implements Iface.
func (r *Real) Init() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var opts []gonvml.LibraryOption
	if r.LibPath != "" {
		opts = append(opts, gonvml.WithLibraryPath(r.LibPath))
	}
	r.lib = gonvml.New(opts...)
	if ret := r.lib.Init(); ret != gonvml.SUCCESS {
		if ret == gonvml.ERROR_LIBRARY_NOT_FOUND {
			if r.LibPath != "" {
				return fmt.Errorf("nvml: cannot open %s", r.LibPath)
			}
			return ErrNoLibrary
		}
		return fmt.Errorf("nvml: init: %s", r.lib.ErrorString(ret))
	}
	r.Driver, _ = r.lib.SystemGetDriverVersion()
	n, ret := r.lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		return fmt.Errorf("nvml: device count: %s", r.lib.ErrorString(ret))
	}
	if es, ret := r.lib.EventSetCreate(); ret == gonvml.SUCCESS {
		r.events = es
	}
	for i := 0; i < n; i++ {
		h, ret := r.lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			return fmt.Errorf("nvml: device %d: %s", i, r.lib.ErrorString(ret))
		}
		d := &realDev{h: h, info: DeviceInfo{Index: i}}
		d.info.UUID, _ = h.GetUUID()
		d.info.Name, _ = h.GetName()
		if pci, ret := h.GetPciInfo(); ret == gonvml.SUCCESS {
			d.info.PCIBusID = cstr(pci.BusId[:])
		}
		d.info.Minor, _ = h.GetMinorNumber()
		for l := 0; l < gonvml.NVLINK_MAX_LINKS; l++ {
			if st, ret := h.GetNvLinkState(l); ret == gonvml.SUCCESS && st == gonvml.FEATURE_ENABLED {
				d.links = append(d.links, l)
			}
		}
		if r.events != nil {
			// XID events are not supported everywhere (MIG, some vGPUs):
			// without them the XID fields stay nil.
			_ = h.RegisterEvents(gonvml.EventTypeXidCriticalError, r.events)
		}
		r.initGPM(d)
		r.devs = append(r.devs, d)
		if cur, _, ret := h.GetMigMode(); ret == gonvml.SUCCESS && cur == gonvml.DEVICE_MIG_ENABLE {
			r.addMIG(d)
		}
	}
	return nil
}

func (r *Real) initGPM(d *realDev) {
	sup, ret := d.h.GpmQueryDeviceSupport()
	if ret != gonvml.SUCCESS {
		d.info.GPMNote = "GPM query: " + r.lib.ErrorString(ret)
		return
	}
	if sup.IsSupportedDevice == 0 {
		d.info.GPMNote = "GPM not supported by this device"
		return
	}
	a, ret1 := r.lib.GpmSampleAlloc()
	b, ret2 := r.lib.GpmSampleAlloc()
	if ret1 != gonvml.SUCCESS || ret2 != gonvml.SUCCESS {
		return
	}
	d.gpmPrev, d.gpmCur = a, b
	d.info.GPM = true
}

func (r *Real) addMIG(parent *realDev) {
	max, ret := parent.h.GetMaxMigDeviceCount()
	if ret != gonvml.SUCCESS {
		return
	}
	for j := 0; j < max; j++ {
		h, ret := parent.h.GetMigDeviceHandleByIndex(j)
		if ret != gonvml.SUCCESS {
			continue
		}
		d := &realDev{h: h, info: parent.info}
		d.info.GPM = false
		d.info.UUID, _ = h.GetUUID()
		name, _ := h.GetName()
		gi, _ := h.GetGpuInstanceId()
		ci, _ := h.GetComputeInstanceId()
		profile := name
		if k := strings.LastIndex(name, " MIG "); k >= 0 {
			profile = name[k+len(" MIG "):]
		}
		d.info.MIG = &MIGInfo{ParentUUID: parent.info.UUID, GPUInstanceID: gi, ComputeInstanceID: ci, Profile: profile}
		r.devs = append(r.devs, d)
	}
}

// Shutdown implements Iface.
func (r *Real) Shutdown() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.devs {
		if d.gpmPrev != nil {
			d.gpmPrev.Free()
			d.gpmCur.Free()
		}
	}
	if r.events != nil {
		r.events.Free()
	}
	if r.lib == nil {
		return nil
	}
	if ret := r.lib.Shutdown(); ret != gonvml.SUCCESS {
		return fmt.Errorf("nvml: shutdown: %s", r.lib.ErrorString(ret))
	}
	return nil
}

// Devices implements Iface.
func (r *Real) Devices() []DeviceInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]DeviceInfo, len(r.devs))
	for i, d := range r.devs {
		out[i] = d.info
	}
	return out
}

// Read implements Iface.
func (r *Real) Read(i int) (Reading, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i < 0 || i >= len(r.devs) {
		return Reading{}, fmt.Errorf("nvml: no device %d", i)
	}
	r.drainEvents()
	d := r.devs[i]
	h := d.h
	rd := Reading{TimeUnixMilli: time.Now().UnixMilli()}
	ok := func(ret gonvml.Return) bool { return ret == gonvml.SUCCESS }

	if u, ret := h.GetUtilizationRates(); ok(ret) {
		rd.UtilGPUPct, rd.UtilMemPct = ptr(u.Gpu), ptr(u.Memory)
	}
	if m, ret := h.GetMemoryInfo_v2(); ok(ret) {
		rd.MemTotalBytes, rd.MemUsedBytes, rd.MemFreeBytes, rd.MemReservedBytes = ptr(m.Total), ptr(m.Used), ptr(m.Free), ptr(m.Reserved)
	} else if m, ret := h.GetMemoryInfo(); ok(ret) {
		rd.MemTotalBytes, rd.MemUsedBytes, rd.MemFreeBytes = ptr(m.Total), ptr(m.Used), ptr(m.Free)
	}
	if d.info.MIG == nil {
		if v, ret := h.GetPowerUsage(); ok(ret) {
			rd.PowerMilliW = ptr(v)
		}
		if v, ret := h.GetTotalEnergyConsumption(); ok(ret) {
			rd.EnergyMilliJ = ptr(v)
		}
		if v, ret := h.GetTemperature(gonvml.TEMPERATURE_GPU); ok(ret) {
			rd.TempC = ptr(v)
		}
		fv := []gonvml.FieldValue{{FieldId: gonvml.FI_DEV_MEMORY_TEMP}}
		if ok(h.GetFieldValues(fv)) && fv[0].NvmlReturn == uint32(gonvml.SUCCESS) {
			if v := fieldUint(fv[0]); v > 0 {
				rd.MemTempC = ptr(uint32(v))
			}
		}
		if v, ret := h.GetClockInfo(gonvml.CLOCK_SM); ok(ret) {
			rd.SMClockMHz = ptr(v)
		}
		if v, ret := h.GetClockInfo(gonvml.CLOCK_MEM); ok(ret) {
			rd.MemClockMHz = ptr(v)
		}
		if v, ret := h.GetPcieThroughput(gonvml.PCIE_UTIL_TX_BYTES); ok(ret) {
			rd.PCIeTxKBps = ptr(v)
		}
		if v, ret := h.GetPcieThroughput(gonvml.PCIE_UTIL_RX_BYTES); ok(ret) {
			rd.PCIeRxKBps = ptr(v)
		}
		if v, ret := h.GetPcieReplayCounter(); ok(ret) {
			rd.PCIeReplays = ptr(uint64(v))
		}
		if len(d.links) > 0 {
			fv := make([]gonvml.FieldValue, 0, 2*len(d.links))
			for _, l := range d.links {
				fv = append(fv, gonvml.FieldValue{FieldId: gonvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ScopeId: uint32(l)},
					gonvml.FieldValue{FieldId: gonvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ScopeId: uint32(l)})
			}
			if ok(h.GetFieldValues(fv)) {
				var tx, rx uint64
				for k, f := range fv {
					if f.NvmlReturn != uint32(gonvml.SUCCESS) {
						continue
					}
					if k%2 == 0 {
						tx += fieldUint(f)
					} else {
						rx += fieldUint(f)
					}
				}
				rd.NVLinkTxKiB, rd.NVLinkRxKiB = ptr(tx), ptr(rx)
			}
		}
		if v, ret := h.GetTotalEccErrors(gonvml.MEMORY_ERROR_TYPE_CORRECTED, gonvml.AGGREGATE_ECC); ok(ret) {
			rd.ECCCorrected = ptr(v)
		}
		if v, ret := h.GetTotalEccErrors(gonvml.MEMORY_ERROR_TYPE_UNCORRECTED, gonvml.AGGREGATE_ECC); ok(ret) {
			rd.ECCUncorrected = ptr(v)
		}
		if c, u, pending, _, ret := h.GetRemappedRows(); ok(ret) {
			rd.RemappedCorr, rd.RemappedUncorr, rd.RemapPending = ptr(uint64(c)), ptr(uint64(u)), ptr(pending)
		}
		if v, ret := h.GetCurrentClocksEventReasons(); ok(ret) {
			rd.ClocksEventMask = ptr(v)
		}
		if r.events != nil {
			rd.XIDCount, rd.XIDLast = ptr(d.xidCount), ptr(d.xidLast)
		}
		r.readGPM(d, &rd)
	}
	if ps, ret := h.GetComputeRunningProcesses(); ok(ret) {
		for _, p := range ps {
			pr := Process{PID: p.Pid}
			// NVML reports an unknown amount (no permission, Windows WDDM)
			// as all ones.
			if p.UsedGpuMemory != ^uint64(0) {
				pr.UsedMemBytes = ptr(p.UsedGpuMemory)
			}
			rd.Processes = append(rd.Processes, pr)
		}
	}
	return rd, nil
}

// readGPM takes a GPM sample and, from the second one on, computes the
// metrics over the interval between the last two.
func (r *Real) readGPM(d *realDev, rd *Reading) {
	if !d.info.GPM {
		return
	}
	if ret := d.h.GpmSampleGet(d.gpmCur); ret != gonvml.SUCCESS {
		d.gpmValid = false
		return
	}
	if d.gpmValid {
		ids := []gonvml.GpmMetricId{gonvml.GPM_METRIC_SM_UTIL, gonvml.GPM_METRIC_SM_OCCUPANCY, gonvml.GPM_METRIC_ANY_TENSOR_UTIL, gonvml.GPM_METRIC_GRAPHICS_UTIL, gonvml.GPM_METRIC_DRAM_BW_UTIL}
		mg := &gonvml.GpmMetricsGetType{NumMetrics: uint32(len(ids)), Sample1: d.gpmPrev, Sample2: d.gpmCur}
		for k, id := range ids {
			mg.Metrics[k].MetricId = uint32(id)
		}
		if ret := r.lib.GpmMetricsGet(mg); ret == gonvml.SUCCESS {
			out := []**float64{&rd.GPMSMActivePct, &rd.GPMSMOccupancy, &rd.GPMTensorPct, &rd.GPMGraphicsPct, &rd.GPMDRAMBWPct}
			for k := range ids {
				if mg.Metrics[k].NvmlReturn == uint32(gonvml.SUCCESS) {
					*out[k] = ptr(mg.Metrics[k].Value)
				}
			}
		}
	}
	d.gpmPrev, d.gpmCur = d.gpmCur, d.gpmPrev
	d.gpmValid = true
}

// drainEvents collects the XID events that arrived since the last read,
// without waiting.
func (r *Real) drainEvents() {
	if r.events == nil {
		return
	}
	for k := 0; k < 64; k++ {
		ev, ret := r.events.Wait(0)
		if ret != gonvml.SUCCESS {
			return
		}
		if ev.EventType != gonvml.EventTypeXidCriticalError || ev.Device == nil {
			continue
		}
		uuid, _ := ev.Device.GetUUID()
		for _, d := range r.devs {
			if d.info.UUID == uuid && d.info.MIG == nil {
				d.xidCount++
				d.xidLast = ev.EventData
			}
		}
	}
}

func fieldUint(f gonvml.FieldValue) uint64 {
	b := f.Value
	v := uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
	switch gonvml.ValueType(f.ValueType) {
	case gonvml.VALUE_TYPE_UNSIGNED_INT:
		return v & 0xffffffff
	case gonvml.VALUE_TYPE_SIGNED_INT:
		return uint64(int32(v))
	}
	return v
}

func cstr(b []uint8) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
