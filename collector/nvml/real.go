package nvml

import (
	"errors"
	"fmt"
	"runtime"
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
	costs  costBook
}

var _ Iface = (*Real)(nil)

type realDev struct {
	h        gonvml.Device
	info     DeviceInfo
	links    []int // active NVLink links
	gpmPrev  gonvml.GpmSample
	gpmCur   gonvml.GpmSample
	gpmValid bool
	// gpmSampled: this read's GPM sample was taken.
	gpmSampled bool
	xidLast    uint64
	xidCount   uint64
	// unsupported holds the calls the device refused as not supported.
	unsupported callSet
	// fv is room for field-value requests, so reads do not allocate it.
	fv [2*gonvml.NVLINK_MAX_LINKS + 2]gonvml.FieldValue
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
	// go-nvml sends the support query a struct version that NVML (whose
	// header defines it as plain 1) refuses as mismatched; then a GPM
	// sample taken once says whether the device has GPM.
	probe := ret == gonvml.ERROR_ARGUMENT_VERSION_MISMATCH
	switch {
	case probe:
	case ret != gonvml.SUCCESS:
		d.info.GPMNote = "GPM query: " + r.lib.ErrorString(ret)
		return
	case sup.IsSupportedDevice == 0:
		d.info.GPMNote = "GPM not supported by this device"
		return
	}
	a, ret1 := r.lib.GpmSampleAlloc()
	b, ret2 := r.lib.GpmSampleAlloc()
	if ret1 != gonvml.SUCCESS || ret2 != gonvml.SUCCESS {
		return
	}
	if probe {
		if ret := d.h.GpmSampleGet(a); ret != gonvml.SUCCESS {
			d.info.GPMNote = "GPM sample: " + r.lib.ErrorString(ret)
			a.Free()
			b.Free()
			return
		}
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

// RecordCosts implements CostRecorder.
func (r *Real) RecordCosts() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.costs.on = true
}

// Costs implements CostRecorder.
func (r *Real) Costs() map[string]*CallCost {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.costs.copy()
	for _, d := range r.devs {
		for c := call(0); c < numCalls; c++ {
			if d.unsupported.has(c) {
				if cc := out[callNames[c]]; cc != nil {
					cc.Unsupported = true
				}
			}
		}
	}
	return out
}

// do makes one NVML call unless the device answered it as unsupported
// before, times it when recording costs, and remembers a refusal that will
// not change while the driver is loaded.
func (r *Real) do(d *realDev, c call, f func() gonvml.Return) bool {
	if d.unsupported.has(c) {
		return false
	}
	m := r.costs.mark()
	ret := f()
	r.costs.note(callNames[c], m)
	switch ret {
	case gonvml.SUCCESS:
		return true
	case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_FUNCTION_NOT_FOUND, gonvml.ERROR_NO_PERMISSION:
		d.unsupported.add(c)
	}
	return false
}

// Read implements Iface: it makes the calls of the call table that serve
// want, in the table's order, each through do.
func (r *Real) Read(i int, want Fields) (Reading, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i < 0 || i >= len(r.devs) {
		return Reading{}, fmt.Errorf("nvml: no device %d", i)
	}
	if r.costs.on {
		// Thread CPU time is only comparable on one thread.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	d := r.devs[i]
	rd := Reading{TimeUnixMilli: time.Now().UnixMilli()}
	phys := d.info.MIG == nil
	answered := false // the call before this one
	for c := range nvmlCalls {
		nc := &nvmlCalls[c]
		if want&nc.group == 0 || (nc.phys && !phys) {
			continue
		}
		ok := false
		switch {
		case nc.fallback && answered:
		case nc.need != nil && !nc.need(r, d):
		case nc.direct:
			nc.read(r, d, &rd)
			ok = true
		default:
			ok = r.do(d, call(c), func() gonvml.Return { return nc.read(r, d, &rd) })
		}
		if nc.after != nil {
			nc.after(d, ok)
		}
		answered = ok || (nc.fallback && answered)
	}
	return rd, nil
}

// nvmlCall is one NVML call of the call table: a GPU value read from a
// call of its own gets a row of its own, and with it its own call id, its
// own cost line and its own memory of a refusal.
type nvmlCall struct {
	// name names the call in cost records and captures; the metric
	// table's NVMLCall names it for each value it gives.
	name string
	// group is the Fields it serves.
	group Fields
	// phys: made on a physical GPU only, not on a MIG instance.
	phys bool
	// fallback: made only when the call before it gave nothing (the
	// older memory call where the v2 one is missing).
	fallback bool
	// need, when set, says whether the device can answer the call at all
	// (GPM, NVLink links, the event set).
	need func(r *Real, d *realDev) bool
	// read makes the call and, when it succeeds, fills rd.
	read func(r *Real, d *realDev, rd *Reading) gonvml.Return
	// direct: read makes and times its calls itself, and has no answer a
	// device refuses (the XID event drain).
	direct bool
	// after, when set, runs once the call was made or passed over, with
	// whether it succeeded.
	after func(d *realDev, ok bool)
}

// nvmlCalls is the call table, in the order Read makes the calls.
var nvmlCalls = [...]nvmlCall{
	{name: "utilization", group: FieldsUtil, read: func(_ *Real, d *realDev, rd *Reading) gonvml.Return {
		u, ret := d.h.GetUtilizationRates()
		if ret == gonvml.SUCCESS {
			rd.UtilGPUPct, rd.UtilMemPct = ptr(u.Gpu), ptr(u.Memory)
		}
		return ret
	}},
	{name: "memory_info_v2", group: FieldsMemory, read: func(_ *Real, d *realDev, rd *Reading) gonvml.Return {
		m, ret := d.h.GetMemoryInfo_v2()
		if ret == gonvml.SUCCESS {
			rd.MemTotalBytes, rd.MemUsedBytes, rd.MemFreeBytes, rd.MemReservedBytes = ptr(m.Total), ptr(m.Used), ptr(m.Free), ptr(m.Reserved)
		}
		return ret
	}},
	{name: "memory_info", group: FieldsMemory, fallback: true, read: func(_ *Real, d *realDev, rd *Reading) gonvml.Return {
		m, ret := d.h.GetMemoryInfo()
		if ret == gonvml.SUCCESS {
			rd.MemTotalBytes, rd.MemUsedBytes, rd.MemFreeBytes = ptr(m.Total), ptr(m.Used), ptr(m.Free)
		}
		return ret
	}},
	{name: "total_energy", group: FieldsEnergy, phys: true, read: func(_ *Real, d *realDev, rd *Reading) gonvml.Return {
		v, ret := d.h.GetTotalEnergyConsumption()
		if ret == gonvml.SUCCESS {
			rd.EnergyMilliJ = ptr(v)
		}
		return ret
	}},
	{name: "power_usage", group: FieldsPower, phys: true, read: func(_ *Real, d *realDev, rd *Reading) gonvml.Return {
		v, ret := d.h.GetPowerUsage()
		if ret == gonvml.SUCCESS {
			rd.PowerMilliW = ptr(v)
		}
		return ret
	}},
	{name: "temperature", group: FieldsTemp, phys: true, read: func(_ *Real, d *realDev, rd *Reading) gonvml.Return {
		v, ret := d.h.GetTemperature(gonvml.TEMPERATURE_GPU)
		if ret == gonvml.SUCCESS {
			rd.TempC = ptr(v)
		}
		return ret
	}},
	{name: "field_memory_temp", group: FieldsTemp, phys: true, read: func(_ *Real, d *realDev, rd *Reading) gonvml.Return {
		fv := &d.fv[0]
		*fv = gonvml.FieldValue{FieldId: gonvml.FI_DEV_MEMORY_TEMP}
		ret := fieldRet(d.h.GetFieldValues(d.fv[:1]), fv)
		if v := fieldUint(*fv); ret == gonvml.SUCCESS && v > 0 {
			rd.MemTempC = ptr(uint32(v))
		}
		return ret
	}},
	{name: "clock_sm", group: FieldsClocks, phys: true, read: func(_ *Real, d *realDev, rd *Reading) gonvml.Return {
		v, ret := d.h.GetClockInfo(gonvml.CLOCK_SM)
		if ret == gonvml.SUCCESS {
			rd.SMClockMHz = ptr(v)
		}
		return ret
	}},
	{name: "clock_mem", group: FieldsClocks, phys: true, read: func(_ *Real, d *realDev, rd *Reading) gonvml.Return {
		v, ret := d.h.GetClockInfo(gonvml.CLOCK_MEM)
		if ret == gonvml.SUCCESS {
			rd.MemClockMHz = ptr(v)
		}
		return ret
	}},
	{name: "clocks_event_reasons", group: FieldsClocks, phys: true, read: func(_ *Real, d *realDev, rd *Reading) gonvml.Return {
		v, ret := d.h.GetCurrentClocksEventReasons()
		if ret == gonvml.SUCCESS {
			rd.ClocksEventMask = ptr(v)
		}
		return ret
	}},
	// GPM: a sample every read; from the second one on, the metrics over
	// the interval between the last two.
	{name: "gpm_sample", group: FieldsGPM, phys: true,
		need: func(_ *Real, d *realDev) bool { return d.info.GPM },
		read: func(_ *Real, d *realDev, _ *Reading) gonvml.Return { return d.h.GpmSampleGet(d.gpmCur) },
		after: func(d *realDev, ok bool) {
			d.gpmSampled = ok
			if !ok {
				d.gpmValid = false
			}
		}},
	{name: "gpm_metrics", group: FieldsGPM, phys: true,
		need: func(_ *Real, d *realDev) bool { return d.gpmSampled && d.gpmValid },
		read: readGPMMetrics,
		after: func(d *realDev, _ bool) {
			if d.gpmSampled {
				d.gpmPrev, d.gpmCur = d.gpmCur, d.gpmPrev
				d.gpmValid = true
			}
		}},
	{name: "pcie_throughput_tx", group: FieldsPCIe, phys: true, read: func(_ *Real, d *realDev, rd *Reading) gonvml.Return {
		v, ret := d.h.GetPcieThroughput(gonvml.PCIE_UTIL_TX_BYTES)
		if ret == gonvml.SUCCESS {
			rd.PCIeTxKBps = ptr(v)
		}
		return ret
	}},
	{name: "pcie_throughput_rx", group: FieldsPCIe, phys: true, read: func(_ *Real, d *realDev, rd *Reading) gonvml.Return {
		v, ret := d.h.GetPcieThroughput(gonvml.PCIE_UTIL_RX_BYTES)
		if ret == gonvml.SUCCESS {
			rd.PCIeRxKBps = ptr(v)
		}
		return ret
	}},
	{name: "field_nvlink_throughput", group: FieldsNVLink, phys: true,
		need: func(_ *Real, d *realDev) bool { return len(d.links) > 0 },
		read: readNVLink},
	{name: "pcie_replay_counter", group: FieldsHealth, phys: true, read: func(_ *Real, d *realDev, rd *Reading) gonvml.Return {
		n, ret := d.h.GetPcieReplayCounter()
		if ret == gonvml.SUCCESS {
			rd.PCIeReplays = ptr(uint64(n))
		}
		return ret
	}},
	{name: "ecc_corrected", group: FieldsHealth, phys: true, read: func(_ *Real, d *realDev, rd *Reading) gonvml.Return {
		v, ret := d.h.GetTotalEccErrors(gonvml.MEMORY_ERROR_TYPE_CORRECTED, gonvml.AGGREGATE_ECC)
		if ret == gonvml.SUCCESS {
			rd.ECCCorrected = ptr(v)
		}
		return ret
	}},
	{name: "ecc_uncorrected", group: FieldsHealth, phys: true, read: func(_ *Real, d *realDev, rd *Reading) gonvml.Return {
		v, ret := d.h.GetTotalEccErrors(gonvml.MEMORY_ERROR_TYPE_UNCORRECTED, gonvml.AGGREGATE_ECC)
		if ret == gonvml.SUCCESS {
			rd.ECCUncorrected = ptr(v)
		}
		return ret
	}},
	{name: "remapped_rows", group: FieldsHealth, phys: true, read: func(_ *Real, d *realDev, rd *Reading) gonvml.Return {
		c, u, pending, _, ret := d.h.GetRemappedRows()
		if ret == gonvml.SUCCESS {
			rd.RemappedCorr, rd.RemappedUncorr, rd.RemapPending = ptr(uint64(c)), ptr(uint64(u)), ptr(pending)
		}
		return ret
	}},
	{name: "event_set_wait", group: FieldsXID, phys: true, direct: true,
		need: func(r *Real, _ *realDev) bool { return r.events != nil },
		read: func(r *Real, d *realDev, rd *Reading) gonvml.Return {
			r.drainEvents("event_set_wait")
			rd.XIDCount, rd.XIDLast = ptr(d.xidCount), ptr(d.xidLast)
			return gonvml.SUCCESS
		}},
	{name: "compute_processes", group: FieldsProcs, read: readProcs},
}

// fieldRet folds the per-field answer of a one-field GetFieldValues into
// the call's.
func fieldRet(ret gonvml.Return, fv *gonvml.FieldValue) gonvml.Return {
	if ret != gonvml.SUCCESS {
		return ret
	}
	return gonvml.Return(fv.NvmlReturn)
}

// readGPMMetrics computes the GPM metrics over the interval between the
// device's last two samples.
func readGPMMetrics(r *Real, d *realDev, rd *Reading) gonvml.Return {
	ids := []gonvml.GpmMetricId{gonvml.GPM_METRIC_SM_UTIL, gonvml.GPM_METRIC_SM_OCCUPANCY, gonvml.GPM_METRIC_ANY_TENSOR_UTIL, gonvml.GPM_METRIC_GRAPHICS_UTIL, gonvml.GPM_METRIC_DRAM_BW_UTIL}
	mg := &gonvml.GpmMetricsGetType{NumMetrics: uint32(len(ids)), Sample1: d.gpmPrev, Sample2: d.gpmCur}
	for k, id := range ids {
		mg.Metrics[k].MetricId = uint32(id)
	}
	ret := r.lib.GpmMetricsGet(mg)
	if ret != gonvml.SUCCESS {
		return ret
	}
	out := []**float64{&rd.GPMSMActivePct, &rd.GPMSMOccupancy, &rd.GPMTensorPct, &rd.GPMGraphicsPct, &rd.GPMDRAMBWPct}
	for k := range ids {
		if mg.Metrics[k].NvmlReturn == uint32(gonvml.SUCCESS) {
			*out[k] = ptr(mg.Metrics[k].Value)
		}
	}
	return ret
}

// readNVLink sums the data counters of the device's active links, in one
// field-value request.
func readNVLink(_ *Real, d *realDev, rd *Reading) gonvml.Return {
	fv := d.fv[:2*len(d.links)]
	for k, l := range d.links {
		fv[2*k] = gonvml.FieldValue{FieldId: gonvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ScopeId: uint32(l)}
		fv[2*k+1] = gonvml.FieldValue{FieldId: gonvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ScopeId: uint32(l)}
	}
	ret := d.h.GetFieldValues(fv)
	if ret != gonvml.SUCCESS {
		return ret
	}
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
	return ret
}

// readProcs lists the compute processes and their device memory.
func readProcs(_ *Real, d *realDev, rd *Reading) gonvml.Return {
	ps, ret := d.h.GetComputeRunningProcesses()
	if ret != gonvml.SUCCESS {
		return ret
	}
	rd.Processes = make([]Process, 0, len(ps))
	for _, p := range ps {
		pr := Process{PID: p.Pid}
		// NVML reports an unknown amount (no permission, Windows WDDM)
		// as all ones.
		if p.UsedGpuMemory != ^uint64(0) {
			pr.UsedMemBytes = ptr(p.UsedGpuMemory)
		}
		rd.Processes = append(rd.Processes, pr)
	}
	return ret
}

// drainEvents collects the XID events of every device that arrived since
// the last drain, without waiting, timing each wait under name.
func (r *Real) drainEvents(name string) {
	if r.events == nil {
		return
	}
	for k := 0; k < 64; k++ {
		var ev gonvml.EventData
		var ret gonvml.Return
		m := r.costs.mark()
		ev, ret = r.events.Wait(0)
		r.costs.note(name, m)
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
